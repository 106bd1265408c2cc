"""The epoch plan and its assignment to ranks and workers, on synthetic planning columns (no I/O)."""
from collections import Counter

import numpy as np
import pytest

from vlmdata.decode import DynamicPolicy, FixedPolicy
from vlmdata.plan import Corpus, EpochPlanner, PlanOptions, rank_packs, split_tail


def synthetic_columns(n_shards=30, seed=0, per_shard=(20, 60), max_images=4, long_frac=0.0):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(per_shard[0], per_shard[1], n_shards)
    n = int(sizes.sum())
    n_images = rng.integers(0, max_images + 1, n).astype(np.int16)
    text = rng.integers(20, 900, n).astype(np.int32)
    text[rng.random(n) < long_frac] = 20000
    m = int(n_images.sum())
    cols = {"shard": np.repeat(np.arange(n_shards, dtype=np.int32), sizes),
            "local": np.concatenate([np.arange(s, dtype=np.int32) for s in sizes]),
            "text_tokens": text, "n_images": n_images,
            "image_start": (np.cumsum(n_images, dtype=np.int64) - n_images),
            "width": rng.integers(50, 1500, m).astype(np.int32), "height": rng.integers(50, 1500, m).astype(np.int32)}
    return cols, sizes


FIXED112 = FixedPolicy(112, 14)


def planner(cols, sizes, seed=0, epoch=0, policy=FIXED112, **opt):
    opts = PlanOptions(**{"max_tokens": 2048, "max_images": 8, "window_shards": 4, **opt})
    return EpochPlanner(Corpus.build([cols], [sizes]), policy, opts, seed, epoch)


def all_packs(p):
    return [p.pack_samples(g)[0].tolist() for g in range(p.total())]


def test_epoch_covers_every_sample_once_and_respects_budgets():
    cols, sizes = synthetic_columns()
    p = planner(cols, sizes)
    packs = all_packs(p)
    flat = [i for pk in packs for i in pk]
    assert sorted(flat) == list(range(int(sizes.sum())))
    for g in range(p.total()):
        _, tok, img = p.pack_samples(g)
        assert tok.sum() <= 2048 and img.sum() <= 8


def test_plan_is_pure_and_changes_with_epoch_and_seed():
    cols, sizes = synthetic_columns()
    assert all_packs(planner(cols, sizes)) == all_packs(planner(cols, sizes))
    assert all_packs(planner(cols, sizes, epoch=1)) != all_packs(planner(cols, sizes))
    assert all_packs(planner(cols, sizes, seed=5)) != all_packs(planner(cols, sizes))


def test_lazy_windows_plan_only_what_is_needed():
    cols, sizes = synthetic_columns(n_shards=40)
    p = planner(cols, sizes)
    p.pack_samples(0)
    assert p.planned_windows <= 2 < p.num_windows


def test_window_locality_and_shuffle():
    cols, sizes = synthetic_columns()
    p = planner(cols, sizes)
    k, _ = p.locate(0)
    window_shards = set(p.window_shards(k))
    assert len(window_shards) == 4
    first_window = [i for g in range(p.starts[1]) for i in p.pack_samples(g)[0]]
    assert set(cols["shard"][first_window].tolist()) == window_shards
    # packs are not in length order
    tokens = [int(p.pack_samples(g)[1].sum()) for g in range(p.starts[1])]
    assert tokens != sorted(tokens) and tokens != sorted(tokens, reverse=True)


def test_overlong_truncate_or_drop_counted():
    cols, sizes = synthetic_columns(long_frac=0.05)
    n_long = int((cols["text_tokens"] == 20000).sum())
    assert n_long > 0
    p = planner(cols, sizes, overlong="drop", max_images=16)
    flat = [i for pk in all_packs(p) for i in pk]
    assert len(flat) == int(sizes.sum()) - n_long
    assert sum(p.drops_at(g)["overlong"] for g in range(p.total())) == n_long
    p = planner(cols, sizes, overlong="truncate", max_images=16)
    flat = [i for pk in all_packs(p) for i in pk]
    assert len(flat) == int(sizes.sum())
    assert sum(sum(p.drops_at(g).values()) for g in range(p.total())) == 0


def test_too_many_images_dropped_and_counted():
    cols, sizes = synthetic_columns(max_images=6)
    p = planner(cols, sizes, max_images=5)
    flat = [i for pk in all_packs(p) for i in pk]
    n_bad = int((cols["n_images"] > 5).sum())
    assert len(flat) == int(sizes.sum()) - n_bad > 0
    assert sum(p.drops_at(g)["too_many_images"] for g in range(p.total())) == n_bad


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


def test_mixing_follows_weights_deterministically():
    a, sa = synthetic_columns(n_shards=10, seed=1)
    b, sb = synthetic_columns(n_shards=20, seed=2)
    corpus = Corpus.build([a, b], [sa, sb], [3.0, 1.0])
    opts = PlanOptions(max_tokens=2048, max_images=8, window_shards=4)
    p = EpochPlanner(corpus, FixedPolicy(112, 14), opts, 0, 0)
    flat = [i for g in range(p.total()) for i in p.pack_samples(g)[0].tolist()]
    n_a = int(sa.sum())
    total = n_a + int(sb.sum())
    from_a = sum(1 for i in flat if i < n_a)
    assert abs(from_a - round(total * 0.75)) <= 1
    assert abs(len(flat) - from_a - round(total * 0.25)) <= 1
    # source a is repeated (its own passes), b sub-sampled without repeats
    counts = Counter(flat)
    assert max(counts[i] for i in range(n_a)) >= 2
    assert max(counts[i] for i in range(n_a, total)) == 1
    # mixed windows hold both sources
    w0 = p.plan_window(0).samples
    assert (w0 < n_a).any() and (w0 >= n_a).any()
    p2 = EpochPlanner(corpus, FixedPolicy(112, 14), opts, 0, 0)
    assert flat == [i for g in range(p2.total()) for i in p2.pack_samples(g)[0].tolist()]


def test_dynamic_policy_lengths():
    cols, sizes = synthetic_columns()
    pol = DynamicPolicy(patch=14, merge=2, min_pixels=56 * 56, max_pixels=224 * 224)
    p = planner(cols, sizes, policy=pol, max_tokens=4096)
    g = 0
    samples, tok, _ = p.pack_samples(g)
    for s, t in zip(samples.tolist(), tok.tolist()):
        st, n = int(cols["image_start"][s]), int(cols["n_images"][s])
        expect = int(cols["text_tokens"][s]) + int(pol.tokens(cols["width"][st:st + n], cols["height"][st:st + n]).sum())
        assert t == min(expect, 4096)


def test_mix_samples_sets_epoch_length():
    a, sa = synthetic_columns(n_shards=6, seed=1)
    b, sb = synthetic_columns(n_shards=6, seed=2)
    corpus = Corpus.build([a, b], [sa, sb], [1.0, 1.0])
    opts = PlanOptions(max_tokens=2048, max_images=8, window_shards=2, mix_samples=101)
    p = EpochPlanner(corpus, FIXED112, opts, 0, 0)
    flat = [i for g in range(p.total()) for i in p.pack_samples(g)[0].tolist()]
    n_a = int(sa.sum())
    assert len(flat) == 101 and len(set(flat)) == 101
    assert abs(sum(i < n_a for i in flat) - 50.5) <= 1
    with pytest.raises(ValueError, match="weights"):
        Corpus.build([a, b], [sa, sb], [0.0, 0.0])
