"""Packs written once into reusable shared memory in the worker and mapped, not copied, by the main process."""
from __future__ import annotations

import copy
import os
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from tests.helpers.dataset import make_samples, write_dataset
from vlmdata.loading import DatasetOptions, PackWriter, VLMDataset, make_loader, set_shared_packs
from vlmdata.loading import shared_pack as sp

S = 32


def _pack(value: int, images: int = 3, shared: bool | None = None):
    w = PackWriter(shared=shared)
    w.add("input_ids", np.int64, (100,))
    w.add("pixel_values", np.uint8, (images, S, S, 3), permute=(0, 3, 1, 2))
    a = w.allocate()
    a["input_ids"][:] = value
    a["pixel_values"][:] = value % 251
    return w.finish({"value": value, "sample_keys": [f"k{value}"], "pid": os.getpid()})


class Packs(IterableDataset):
    """Yields n packs made with PackWriter (as collate does), each filled with its number."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for i in range(info.id, self.n, info.num_workers):
            yield _pack(i, images=1 + i % 4)


def _mapping_of(address: int) -> str:
    """The name of the mapping of this process holding `address` (from /proc/self/maps)."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                return " ".join(parts[5:])
    return ""


def _loader(ds, workers=2, **kw):
    return DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=lambda b: b, **kw)


@pytest.mark.skipif(not sp.shared_memory_available(), reason="needs memfd (Linux)")
def test_worker_packs_cross_without_a_copy_and_buffers_are_reused():
    seen, pids = 0, set()
    for b in _loader(Packs(40)):
        v = b["value"]
        pids.add(b["pid"])
        assert isinstance(b, sp.PackedBatch) and int(b["input_ids"][0]) == v
        px = b["pixel_values"]
        assert px.shape == (1 + v % 4, 3, S, S) and px.is_contiguous(memory_format=torch.channels_last)
        assert bool((px == v % 251).all())
        # the main process reads the worker's own buffer: a mapping of its memfd, not torch's
        # per-tensor shared-memory copy (/dev/shm/torch_*) nor private memory
        for name in ("pixel_values", "input_ids"):
            assert "memfd:vlmdata-pack" in _mapping_of(b[name].data_ptr()), _mapping_of(b[name].data_ptr())
        seen += 1
        del b, px
    assert seen == 40
    # the pool was reused: each worker sent its few buffers' descriptors once, not one per pack
    ours = [k for k in sp._KNOWN if int(k.split("-", 1)[0]) in pids]
    assert len(pids) == 2 and 0 < len(ours) <= 2 * 4, ours


@pytest.mark.skipif(not sp.shared_memory_available(), reason="needs memfd (Linux)")
def test_packs_held_by_the_consumer_are_never_overwritten():
    held = list(_loader(Packs(3 * sp.POOL_BUFFERS)))           # more packs than pool buffers, all kept
    assert sorted(b["value"] for b in held) == list(range(3 * sp.POOL_BUFFERS))
    for b in held:
        assert bool((b["input_ids"] == b["value"]).all()) and bool((b["pixel_values"] == b["value"] % 251).all())


def test_release_when_the_receiver_drops_the_pack():
    set_shared_packs(True)
    try:
        b = _pack(7)
        lease = b.__dict__["_lease"]
        got = pickle.loads(ForkingPickler.dumps(b))
        buf = lease.buffer
        assert not buf.is_free() and int(got["input_ids"][5]) == 7
        view = got["pixel_values"][1:]                   # a view keeps the buffer held
        del got
        assert not buf.is_free()
        assert int(view[0, 0, 0, 0]) == 7
        del view
        assert buf.is_free()
        again = _pack(8)                                 # same size: the same buffer is reused
        assert again.__dict__["_lease"].buffer is buf
        del b, again                                      # never sent: freed on the worker side
        assert buf.is_free()
    finally:
        set_shared_packs(None)


def test_second_send_and_plain_pickling_copy_instead():
    set_shared_packs(True)
    try:
        b = _pack(3)
        first = pickle.loads(ForkingPickler.dumps(b))
        second = pickle.loads(ForkingPickler.dumps(copy.copy(b)))    # a copy shares the lease: sent once
        assert "memfd:vlmdata-pack" not in _mapping_of(second["input_ids"].data_ptr())
        plain = pickle.loads(pickle.dumps(b))                            # pickle, torch.save, deepcopy
        deep = copy.deepcopy(b)
        for other in (second, plain, deep):
            assert type(other) is sp.PackedBatch and other["value"] == 3
            assert torch.equal(other["input_ids"], first["input_ids"])
            assert torch.equal(other["pixel_values"], first["pixel_values"])
    finally:
        set_shared_packs(None)


def test_pool_retires_small_buffers_and_the_receiver_forgets_them(monkeypatch):
    monkeypatch.setattr(sp, "POOL_BUFFERS", 1)
    monkeypatch.setattr(sp, "_POOL", None)
    set_shared_packs(True)
    try:
        small = _pack(1, images=1)
        key = small.__dict__["_lease"].buffer.key
        pickle.loads(ForkingPickler.dumps(small))         # received and dropped at once
        assert key in sp._KNOWN
        big = _pack(2, images=400)                        # over 1 MiB: the free small buffer is replaced
        assert big.__dict__["_lease"].buffer.key != key
        got = pickle.loads(ForkingPickler.dumps(big))
        assert key not in sp._KNOWN and int(got["input_ids"][0]) == 2
    finally:
        set_shared_packs(None)


def test_in_process_packs_are_private():
    b = _pack(5)
    assert "_lease" not in b.__dict__
    assert "memfd" not in _mapping_of(b["input_ids"].data_ptr())
    assert b["pixel_values"].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.skipif(not sp.shared_memory_available(), reason="needs memfd (Linux)")
def test_memmap_dataset_pixels_reach_the_main_process_in_the_workers_buffer(tmp_path):
    samples = make_samples(40, seed=3, max_images=3)
    write_dataset(str(tmp_path), samples, shard_size=10, kind="memmap", image_size=56)
    ds = VLMDataset(str(tmp_path), max_tokens=2048, image_size=56, rank=0, world_size=1,
                    options=DatasetOptions(window_shards=2))
    ref = {tuple(b["sample_keys"]): b["pixel_values"].clone()          # in process: private memory
           for b in make_loader(ds, num_workers=0)}
    n = 0
    for b in make_loader(ds, num_workers=2, pin_memory=False):
        px = b["pixel_values"]
        assert torch.equal(px, ref[tuple(b["sample_keys"])])
        if px.numel():
            assert "memfd:vlmdata-pack" in _mapping_of(px.data_ptr())
            n += 1
    assert n > 0
