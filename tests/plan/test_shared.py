"""Windows shared through a PlanShare: planned once however many processes ask, equal in every process,
bounded by eviction, refused when they belong to another plan; private shares clean up after themselves."""
import multiprocessing
import os
import pickle

import numpy as np
import pytest

from tests.helpers.plan import FIXED112, synthetic_columns
from tests.helpers.plan_cases import digest
from vlmdata.plan import Corpus, EpochPlanner, LocalWindows, PlanOptions, PlanShare, rank_packs

OPTS = PlanOptions(max_tokens=2048, max_images=8, window_shards=3)


def corpus():
    cols, sizes = synthetic_columns(n_shards=30, seed=4)
    return Corpus.build([cols], [sizes])


def items_as_data(items):
    return [[a.samples.tolist(), a.step, a.cursor, a.window, sorted(a.dropped.items())] for a in items]


def worker_schedule(share_root: str, key: str, worker: int, workers: int, out) -> None:
    """What DataLoader worker `worker` of `workers` yields (world 2, rank 1), planning through the share."""
    share = PlanShare.at(share_root)
    # keep every window: these processes run free (DataLoader workers are held together by the consumer),
    # so one may finish before another starts; windows evicted behind a laggard are planned again
    p = EpochPlanner(corpus(), FIXED112, OPTS, 7, 1, store=lambda n: share.store(key, n, keep=n))
    out.put((worker, digest(items_as_data(rank_packs(p, 0, 2, 1, worker, workers))), p.store.computed))


def test_processes_sharing_a_plan_plan_each_window_once_and_get_the_same_packs(tmp_path):
    key = "plan-e1"
    workers = 3
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker_schedule, args=(str(tmp_path), key, w, workers, out)) for w in range(workers)]
    for p in procs:
        p.start()
    got = dict((w, (d, c)) for w, d, c in (out.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    alone = [digest(items_as_data(rank_packs(EpochPlanner(corpus(), FIXED112, OPTS, 7, 1), 0, 2, 1, w, workers)))
             for w in range(workers)]
    assert [got[w][0] for w in range(workers)] == alone            # equal to planning alone, in every process
    store = PlanShare.at(str(tmp_path)).store(key, EpochPlanner(corpus(), FIXED112, OPTS, 7, 1).num_windows)
    planned = [w for w, _, _ in store.journal()]
    assert sorted(planned) == list(range(store.num_windows))      # every window planned exactly once ...
    assert sum(c for _, c in got.values()) == store.num_windows    # ... by one of the processes
    assert len({pid for _, pid, _ in store.journal()}) >= 1


def test_a_second_store_maps_what_the_first_planned(tmp_path):
    share = PlanShare.at(str(tmp_path))
    a = EpochPlanner(corpus(), FIXED112, OPTS, 0, 0, store=lambda n: share.store("k-e0", n))
    b = EpochPlanner(corpus(), FIXED112, OPTS, 0, 0, store=lambda n: share.store("k-e0", n))
    total = a.total()
    assert b.store.count(0) == a.counts[0]
    assert b.total() == total and b.store.computed == 0            # counts came from the share
    for g in range(total):
        assert np.array_equal(a.pack_samples(g)[0], b.pack_samples(g)[0])
    assert b.store.computed == 0 and b.store.mapped >= 1
    local = EpochPlanner(corpus(), FIXED112, OPTS, 0, 0, store=LocalWindows())
    assert [local.pack_samples(g)[0].tolist() for g in range(total)] == \
        [b.pack_samples(g)[0].tolist() for g in range(total)]


def test_old_windows_are_evicted_and_planned_again_identically(tmp_path):
    share = PlanShare.at(str(tmp_path))
    p = EpochPlanner(corpus(), FIXED112, OPTS, 0, 0, store=lambda n: share.store("k-e0", n, keep=2))
    n = p.num_windows
    first = p.plan_window(0).samples.tolist()
    for k in range(n):
        p.plan_window(k)
    files = sorted(f for f in os.listdir(os.path.join(str(tmp_path), "k-e0")) if f.endswith(".plan"))
    assert len(files) <= 3 and files[-1] == f"w{n - 1:07d}.plan"
    again = EpochPlanner(corpus(), FIXED112, OPTS, 0, 0, store=lambda n: share.store("k-e0", n, keep=2))
    assert again.plan_window(0).samples.tolist() == first and again.store.computed == 1


def test_windows_of_another_plan_are_planned_again_not_used(tmp_path, caplog):
    share = PlanShare.at(str(tmp_path))
    p = EpochPlanner(corpus(), FIXED112, OPTS, 0, 0, store=lambda n: share.store("a-e0", n))
    p.plan_window(0)
    d = os.path.join(str(tmp_path), "a-e0")
    os.makedirs(os.path.join(str(tmp_path), "b-e0"))
    os.replace(os.path.join(d, "w0000000.plan"), os.path.join(str(tmp_path), "b-e0", "w0000000.plan"))
    other = EpochPlanner(corpus(), FIXED112, OPTS, 1, 0, store=lambda n: share.store("b-e0", n))
    alone = EpochPlanner(corpus(), FIXED112, OPTS, 1, 0).plan_window(0).samples.tolist()
    assert other.plan_window(0).samples.tolist() == alone != p.plan_window(0).samples.tolist()
    assert other.store.computed == 1 and "not window 0 of b-e0" in caplog.text
    with pytest.raises(ValueError, match="two different plans"):
        share.store("a-e0", p.num_windows + 1)
    with pytest.raises(ValueError, match="plan key"):
        share.store("../escape", 3)


def test_node_share_drops_epochs_older_than_the_previous_one(tmp_path):
    share = PlanShare.at(str(tmp_path))
    for e in range(4):
        share.store(f"fp-e{e}", 2)
    share.store("other-e0", 2)
    assert sorted(os.listdir(str(tmp_path))) == ["fp-e2", "fp-e3", "other-e0"]


def test_private_share_is_removed_by_its_creator_only(tmp_path):
    share = PlanShare.create(str(tmp_path))
    assert os.path.isdir(share.root) and os.path.basename(share.root).startswith(f"vlmdata-plan-{os.getpid()}-")
    copy = pickle.loads(pickle.dumps(share))
    del copy                                             # a worker's copy going away removes nothing
    assert os.path.isdir(share.root)
    dead = tmp_path / "vlmdata-plan-999999999-x"        # a share left by a process that no longer exists
    dead.mkdir()
    other = PlanShare.create(str(tmp_path))
    assert not dead.exists()
    share.close()
    other.close()
    assert not os.path.exists(share.root) and not os.path.exists(other.root)


def test_a_full_share_plans_on_unshared(tmp_path, monkeypatch, caplog):
    import vlmdata.plan.shared as shared_module

    share = PlanShare.at(str(tmp_path))
    p = EpochPlanner(corpus(), FIXED112, OPTS, 0, 0, store=lambda n: share.store("k-e0", n))

    def full(*args, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shared_module.tempfile, "mkstemp", full)
    alone = EpochPlanner(corpus(), FIXED112, OPTS, 0, 0)
    assert p.plan_window(1).samples.tolist() == alone.plan_window(1).samples.tolist()
    assert "cannot share planned windows" in caplog.text
    assert not [f for f in os.listdir(tmp_path / "k-e0") if f.endswith(".plan")]
