"""AdaptedDataset / make_loader(adapter=...): the adapter runs where packs are made; the rest is the dataset's."""
from __future__ import annotations

import os

import pytest

from tests.helpers.dataset import make_samples, write_dataset
from vlmdata.loading import AdaptedDataset, VLMDataset, make_loader


class Tag:
    """A picklable adapter that records which process adapted the pack."""

    def __call__(self, pack: dict) -> dict:
        return {"keys": pack["sample_keys"], "pid": os.getpid(), "epoch": pack["state"]["epoch"]}

    def fingerprint(self) -> dict:
        return {"adapter": "tag"}


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("adapted"))
    write_dataset(root, make_samples(20, seed=3, max_images=1))
    return root


def test_adapter_runs_in_the_workers_and_sees_every_sample(ds_path):
    ds = VLMDataset(ds_path, max_tokens=256, image_size=56, rank=0, world_size=1, decoder="pillow")
    ds.set_epoch(1)
    batches = list(make_loader(ds, num_workers=2, adapter=Tag()))
    assert all(b["pid"] != os.getpid() for b in batches) and len({b["pid"] for b in batches}) == 2
    keys = [k for b in batches for k in b["keys"]]
    assert sorted(keys) == [f"s{i:05d}" for i in range(20)]
    assert {b["epoch"] for b in batches} == {1}


def test_delegation(ds_path):
    ds = VLMDataset(ds_path, max_tokens=256, image_size=56, rank=0, world_size=1, decoder="pillow")
    adapted = AdaptedDataset(ds, Tag())
    adapted.set_epoch(2)
    assert adapted.epoch == ds.epoch == 2
    assert len(adapted) == ds.num_steps() > 0
    adapted.set_decode_threads(3)
    assert adapted.decode_threads == ds.decode_threads == 3
    assert adapted.tune_fingerprint()["adapter"] == {"adapter": "tag"}
    state = next(iter(adapted)) and ds.state_dict()
    adapted.load_state_dict(state)
    assert adapted.state_dict()["cursor"] == state["cursor"]
    with pytest.raises(ValueError, match="already has an adapter"):
        AdaptedDataset(adapted, Tag())
    with pytest.raises(TypeError, match="does not know its number of packs"):
        len(AdaptedDataset([{"a": 1}], Tag()))
