"""VLMDataset plans once per rank (or node), shares the windows with its DataLoader workers, and resumes from
the window a state names: exactly once through real workers (fork and spawn), each window planned once."""
import os

import pytest

from tests.helpers.dataset import make_samples, write_dataset
from vlmdata.loading import DatasetOptions, VLMDataset, make_loader
from vlmdata.plan import PlanShare


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ds"))
    samples = make_samples(96, seed=2, long_text=120)
    write_dataset(root, samples, shard_size=12)
    return root, sorted(s.key for s in samples)


def dataset(root, rank=0, world=1, **opts):
    return VLMDataset(root, seed=3, max_tokens=512, max_images=6, image_size=56, rank=rank, world_size=world,
                      options=DatasetOptions(**{"window_shards": 2, **opts}))


def journal(ds, epoch=0):
    """(window, pid) of every window planned into the dataset's share for this epoch."""
    store = ds._plan_share.store(f"{ds.fingerprint}-e{epoch}", ds.planner(epoch).num_windows)
    return [(w, pid) for w, pid, _ in store.journal()]


def keys(batches):
    return [k for b in batches for k in b["sample_keys"]]


@pytest.mark.parametrize("context,world,workers", [("fork", 2, 3), ("spawn", 1, 2)])
def test_workers_of_a_rank_share_one_plan_and_deliver_exactly_once(corpus, context, world, workers):
    root, all_keys = corpus
    got = []
    for rank in range(world):
        ds = dataset(root, rank, world)
        got += keys(make_loader(ds, num_workers=workers, multiprocessing_context=context))
        planned = journal(ds)
        n = ds.planner().num_windows
        assert sorted(w for w, _ in planned) == list(range(n))    # each window planned once for the rank's workers
        assert {w for w, pid in planned if pid == os.getpid()} == {0}   # the first by the training process (warm
        #                                                                 start), the rest by the workers
    assert sorted(got) == all_keys                                # exactly once over both ranks


def test_a_node_plan_dir_plans_each_window_once_for_all_ranks(corpus, tmp_path):
    root, all_keys = corpus
    got, planned = [], []
    for rank in (0, 1):
        ds = dataset(root, rank, 2, plan_dir=str(tmp_path / "plans"))
        got += keys(make_loader(ds, num_workers=2))
        planned = journal(ds)
    assert sorted(got) == all_keys
    assert sorted(w for w, _ in planned) == list(range(ds.planner().num_windows))   # rank 1 planned nothing


def test_resume_states_name_a_window_and_resuming_plans_from_it(corpus):
    root, _ = corpus
    whole = list(make_loader(dataset(root, window_shards=1), num_workers=2))
    cut = len(whole) * 2 // 3
    state = whole[cut - 1]["state"]
    k, start = state["window"]
    assert k > 1 and start <= state["cursor"]
    fresh = dataset(root, window_shards=1)
    fresh.load_state_dict(state)
    assert fresh.state_dict()["window"] == [k, start]
    rest = list(make_loader(fresh, num_workers=2))
    assert keys(rest) == keys(whole[cut:])
    assert [b["state"]["cursor"] for b in rest] == [b["state"]["cursor"] for b in whole[cut:]]
    early = [w for w, pid in journal(fresh) if w < k - 1]
    assert early == [0] * len(early) and len(early) <= 1       # no window far before the resume point planned
    #                                                             (window 0: the warm start before the state came)
    fresh.set_epoch(1)
    assert "window" not in fresh.state_dict()


def test_private_share_is_made_before_workers_and_removed_with_the_dataset(corpus):
    root, _ = corpus
    ds = dataset(root)
    share_root = ds._plan_share.root
    assert os.path.isdir(share_root) and isinstance(ds._plan_share, PlanShare)
    list(make_loader(ds, num_workers=1))
    ds._plan_share.close()
    assert not os.path.exists(share_root)


def test_a_windows_first_pack_does_not_wait_for_the_next_windows_plan(corpus):
    """The next window is planned right after a window's first pack (to announce its exact reads),
    not before it: the cold start plans one window."""
    root, all_keys = corpus
    ds = dataset(root, window_shards=2, warm_start=False)
    assert journal(ds) == []                                           # nothing planned before iterating
    n = ds.planner().num_windows
    assert n >= 3
    it = iter(ds)
    first = next(it)
    assert first["sample_keys"] and sorted(w for w, _ in journal(ds)) == [0]
    second = next(it)
    assert sorted(w for w, _ in journal(ds)) == [0, 1]                 # planned after the first pack
    rest = [b for b in it]
    assert sorted(keys([first, second, *rest])) == all_keys            # still exactly once


def test_warm_start_plans_the_first_window_in_the_background_once(corpus):
    root, all_keys = corpus
    ds = dataset(root)
    ds.planner()                                                       # waits for the warm-start thread
    assert journal(ds) == [(0, os.getpid())]
    got = keys(make_loader(ds, num_workers=2))
    planned = journal(ds)
    assert sorted(got) == all_keys
    assert sorted(w for w, _ in planned) == list(range(ds.planner().num_windows))   # window 0 not planned again
