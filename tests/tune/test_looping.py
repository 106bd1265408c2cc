"""LoopedDataset: a tuning run never ends because the data did; each pass is the next epoch."""
from __future__ import annotations

import itertools
import logging

from torch.utils.data import DataLoader, IterableDataset

from tests.helpers.dataset import make_samples, write_dataset
from vlmdata.loading import VLMDataset
from vlmdata.testing import SyntheticDataset, SyntheticSpec
from vlmdata.tune import LoopedDataset


class Empty(IterableDataset):
    def __iter__(self):
        return iter(())


def test_loops_a_vlmdataset_over_epochs_in_workers(tmp_path, caplog):
    write_dataset(str(tmp_path), make_samples(24, seed=5, max_images=1), shard_size=8)
    ds = VLMDataset(str(tmp_path), max_tokens=1024, image_size=56, rank=0, world_size=1, decoder="pillow")
    one_epoch = [tuple(b["sample_keys"]) for b in ds]
    looped = LoopedDataset(ds)
    loader = DataLoader(looped, batch_size=None, num_workers=2, collate_fn=lambda b: b)
    with caplog.at_level(logging.WARNING, logger="vlmdata.loading.dataset"):
        got = [tuple(b["sample_keys"]) for b in itertools.islice(loader, 3 * len(one_epoch))]
    assert len(got) == 3 * len(one_epoch)                          # went on past the dataset's end
    keys = [k for pack in got for k in pack]
    assert sorted(set(keys)) == sorted({k for pack in one_epoch for k in pack})
    assert got[len(one_epoch):2 * len(one_epoch)] != got[:len(one_epoch)]   # the next pass is the next epoch
    assert "iterated again" not in caplog.text                    # a fresh copy per pass, no repeated epoch
    assert ds.epoch == 0                                           # the caller's dataset is untouched


def test_decode_threads_pass_through_and_empty_stops():
    ds = SyntheticDataset(SyntheticSpec())
    looped = LoopedDataset(ds)
    looped.set_decode_threads(3)
    assert ds.decode_threads == 3 and looped.decode_threads == 3
    assert list(LoopedDataset(Empty())) == []
