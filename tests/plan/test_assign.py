"""Assigning the epoch plan to ranks and workers: equal steps, exactly once, the global sequence independent of
the world size, resume with another world size, the tail split."""
import numpy as np
import pytest

from tests.helpers.plan import planner, synthetic_columns
from vlmdata.plan import rank_packs, split_tail


def schedule(p, world, workers, base=0):
    """What each (rank, worker) yields, merged in DataLoader round-robin order per rank."""
    out = {}
    for r in range(world):
        per_worker = [list(rank_packs(p, base, world, r, w, workers)) for w in range(workers)]
        merged = []
        for i in range(max(len(x) for x in per_worker)):
            merged += [x[i] for x in per_worker if i < len(x)]
        out[r] = merged
    return out


@pytest.mark.parametrize("world,workers", [(1, 1), (2, 3), (3, 2), (4, 1), (7, 3)])
def test_every_rank_same_steps_and_exactly_once(world, workers):
    cols, sizes = synthetic_columns()
    p = planner(cols, sizes)
    sched = schedule(p, world, workers)
    lengths = {len(v) for v in sched.values()}
    assert len(lengths) == 1                                   # equal step counts: no DDP hang
    seen = [i for v in sched.values() for a in v for i in a.samples.tolist()]
    assert sorted(seen) == list(range(int(sizes.sum())))
    for v in sched.values():                                   # round-robin order = step order
        assert [a.step for a in v] == list(range(len(v)))


def test_global_sequence_independent_of_world_size():
    cols, sizes = synthetic_columns()
    p = planner(cols, sizes)
    n = p.total()
    for world in (1, 2, 5):
        sched = schedule(p, world, 2)
        full_steps = n // world
        for s in range(full_steps):
            for r in range(world):
                assert sched[r][s].samples.tolist() == p.pack_samples(s * world + r)[0].tolist()


def test_resume_with_other_world_size_loses_and_repeats_nothing():
    cols, sizes = synthetic_columns()
    p = planner(cols, sizes)
    before = schedule(p, 2, 3)
    cursor = before[0][6].cursor                               # state after step 6
    assert cursor == before[1][6].cursor == 14
    consumed = [i for r in (0, 1) for a in before[r][:7] for i in a.samples.tolist()]
    after = schedule(p, 1, 2, base=cursor)
    rest = [i for a in after[0] for i in a.samples.tolist()]
    assert sorted(consumed + rest) == list(range(int(sizes.sum())))


def test_tail_split_keeps_budgets_and_balances():
    tokens = {i: t for i, t in enumerate([900, 800, 700, 300, 200, 100, 50])}
    parts = split_tail([np.array([0, 3, 4, 6]), np.array([1, 2, 5])], tokens, 4)
    assert len(parts) == 4
    assert sorted(i for p in parts for i in p.tolist()) == list(range(7))
    assert max(sum(tokens[i] for i in p.tolist()) for p in parts) <= 1500   # each part is a piece of a pack
    # fewer samples than ranks: the rest get empty packs
    parts = split_tail([np.array([0, 1])], tokens, 3)
    assert [len(p) for p in parts] == [1, 1, 0]
