"""persistent_workers=True: set_epoch() and load_state_dict() on the main process's dataset reach the workers."""
from __future__ import annotations

import pytest

from tests.helpers.dataset import make_samples, write_dataset
from vlmdata.loading import DatasetOptions, VLMDataset, make_loader


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ds"))
    write_dataset(root, make_samples(64, seed=4), shard_size=8)
    return root


def dataset(root):
    return VLMDataset(root, seed=0, max_tokens=512, max_images=6, image_size=56, rank=0, world_size=1,
                      options=DatasetOptions(window_shards=2))


def reference(root, epoch: int) -> list:
    """What a fresh loader delivers in `epoch` (full packs, with their resume states)."""
    ds = dataset(root)
    ds.set_epoch(epoch)
    return list(make_loader(ds, num_workers=2))


def keys(batches) -> list[list[str]]:
    return [b["sample_keys"] for b in batches]


def test_persistent_workers_follow_set_epoch_and_load_state_dict(root):
    ref = {e: reference(root, e) for e in (0, 1, 2)}
    assert keys(ref[0]) != keys(ref[1]) != keys(ref[2])
    ds = dataset(root)
    loader = make_loader(ds, num_workers=2, persistent_workers=True)
    for e in (0, 1, 2):
        ds.set_epoch(e)
        assert keys(loader) == keys(ref[e])
    assert keys(loader) == keys(ref[2])                 # no set_epoch: the same epoch again
    ds.load_state_dict(ref[1][4]["state"])               # resume mid-epoch 1 in the same workers
    assert keys(loader) == keys(ref[1][5:])
    ds.set_epoch(0)                                      # another epoch: from its start
    assert keys(loader) == keys(ref[0])


@pytest.mark.slow
@pytest.mark.integration  # a spawned worker (the shared value travels by pickling at spawn; it imports torch)
def test_persistent_spawned_workers_follow_set_epoch(root):
    ref1 = keys(reference(root, 1))                      # the pack order does not depend on the worker count
    ds = dataset(root)
    loader = make_loader(ds, num_workers=1, persistent_workers=True, multiprocessing_context="spawn")
    first = keys(loader)
    ds.set_epoch(1)
    assert keys(loader) == ref1 != first
