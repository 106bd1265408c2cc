"""Memmap packs read whole (loading.memmap_pack) give exactly the batches of the per-sample path, skip and count
the same samples, and fall back to the per-sample path for a pack they cannot take."""
from __future__ import annotations

import dataclasses
import os
import shutil
from collections import Counter

import numpy as np
import pytest
import torch

import vlmdata.loading.dataset as dataset_module
from tests.helpers.dataset import TOK, make_samples, write_dataset
from vlmdata.decode import FixedPolicy
from vlmdata.formats import MemmapShard, SampleIndex
from vlmdata.loading import (
    CollateConfig,
    DatasetOptions,
    MemmapReader,
    VLMDataset,
    build_pack,
    make_loader,
    read_memmap_pack,
)
from vlmdata.metrics import StatsDelta

MAX_TOKENS = 512
SIZE = 56


def swap_first_images(root: str, index_name: str) -> list[str]:
    """Swap the first image rows of the shard's first two samples with images (in bounds: only the owner
    check sees it); their keys."""
    path = os.path.join(root, index_name)
    ix = SampleIndex.load(path)
    a, b = [i for i in range(len(ix)) if ix.n_images[i] > 0][:2]
    img_offset = ix.img_offset.copy()
    ia, ib = int(ix.image_start[a]), int(ix.image_start[b])
    img_offset[ia], img_offset[ib] = img_offset[ib], img_offset[ia]
    dataclasses.replace(ix, img_offset=img_offset).save(path)
    return [ix.keys()[a], ix.keys()[b]]


def flip_byte(path: str, at: int) -> None:
    """Damage the shard's bytes in place, same size: its CRC no longer matches the manifest."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """40 samples in 5 memmap shards: two samples of shard 0 with swapped image rows, shard 2 damaged."""
    root = str(tmp_path_factory.mktemp("mm"))
    samples = make_samples(40, seed=5)
    m = write_dataset(root, samples, shard_size=8, kind="memmap", image_size=SIZE)
    swapped = swap_first_images(root, m.shards[0].index)
    flip_byte(os.path.join(root, m.shards[2].name), 100)
    return root, samples, swapped


def load(root, pack_reads: bool, state=None, workers=0, max_tokens=MAX_TOKENS):
    ds = VLMDataset(root, max_tokens=max_tokens, max_images=6, image_size=SIZE, rank=0, world_size=1,
                    options=DatasetOptions(window_shards=2))
    ds.memmap_pack_reads = pack_reads
    if state is not None:
        ds.load_state_dict(state)
    return list(make_loader(ds, num_workers=workers))


@pytest.fixture
def pack_reads(monkeypatch):
    """Counts of the packs read whole ("whole") and of those handed back to the per-sample path ("fallback")."""
    counts = Counter()

    def counting(*args, **kw):
        batch = read_memmap_pack(*args, **kw)
        counts["whole" if batch is not None else "fallback"] += 1
        return batch

    monkeypatch.setattr(dataset_module, "read_memmap_pack", counting)
    return counts


def assert_identical(got: list, want: list) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert set(a) == set(b)
        for name in a:
            if isinstance(a[name], torch.Tensor):
                x, y = a[name], b[name]
                assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride(), name
                assert torch.equal(x, y), name
            else:
                assert a[name] == b[name], name


def skipped(batches) -> dict:
    out = Counter()
    for b in batches:
        out.update(b["stats"]["skipped"])
    return dict(out)


def test_pack_reads_equal_sample_reads_over_an_epoch_with_resume(corpus, pack_reads):
    root, samples, swapped = corpus
    whole = load(root, pack_reads=True)
    empty = sum(not b["sample_keys"] for b in whole)           # packs of the damaged shard only: padding
    assert pack_reads == {"whole": len(whole) - empty, "fallback": empty} and empty < len(whole) // 2
    per_sample = load(root, pack_reads=False)
    assert pack_reads == {"whole": len(whole) - empty, "fallback": empty}     # the per-sample run: none
    assert len(whole) >= 4
    assert_identical(whole, per_sample)
    assert skipped(whole) == {"index_mismatch": 2, "corrupt_shard": 8}
    delivered = [k for b in whole for k in b["sample_keys"]]
    assert sorted(delivered) == sorted(s.key for s in samples[:16] + samples[24:] if s.key not in swapped)
    at = len(whole) // 2
    assert_identical(load(root, True, state=whole[at]["state"]), per_sample[at + 1:])
    assert_identical(load(root, False, state=per_sample[at]["state"]), per_sample[at + 1:])


def test_pack_reads_through_workers_equal_sample_reads(corpus):
    root, _, _ = corpus
    assert_identical(load(root, True, workers=2), load(root, False, workers=2))


def test_packs_with_samples_to_truncate_are_read_whole_and_equal_sample_reads(tmp_path, pack_reads):
    root = str(tmp_path / "mm")
    write_dataset(root, make_samples(32, seed=6, long_text=120), shard_size=8, kind="memmap", image_size=SIZE)
    whole = load(root, True, max_tokens=96)
    assert pack_reads == {"whole": len(whole)}
    assert sum(b["stats"]["truncated"] for b in whole) > 0
    assert_identical(whole, load(root, False, max_tokens=96))


def test_a_pack_with_a_sample_whose_placeholders_do_not_match_falls_back_to_the_per_sample_path(tmp_path, pack_reads):
    """A shard written with one image placeholder too many for one sample: the per-sample path skips and counts
    that sample (bad_sample), and the pack holding it is read that way, with the same result."""
    root = str(tmp_path / "mm")
    samples = make_samples(24, seed=9)
    bad = next(s for s in samples if s.images)
    bad.tokens = np.concatenate([bad.tokens[:, :1], [[TOK.special.image], [0]], bad.tokens[:, 1:]], axis=1)
    bad.tokens = bad.tokens.astype(np.int32)
    write_dataset(root, samples, shard_size=8, kind="memmap", image_size=SIZE)
    whole = load(root, True)
    assert pack_reads["fallback"] == 1 and pack_reads["whole"] == len(whole) - 1
    assert skipped(whole) == {"bad_sample": 1}
    assert sorted(k for b in whole for k in b["sample_keys"]) == sorted(s.key for s in samples if s is not bad)
    assert_identical(whole, load(root, False))


def test_shard_rewritten_in_place_mid_epoch_never_delivers_another_samples_pixels(tmp_path, pack_reads):
    root = str(tmp_path / "mm")
    samples = make_samples(32, seed=7)
    m = write_dataset(root, samples, shard_size=8, kind="memmap", image_size=SIZE)
    shutil.copytree(root, tmp_path / "untouched")
    own = {}
    for b in load(str(tmp_path / "untouched"), True):
        pixels = b["pixel_values"].permute(0, 2, 3, 1).numpy()
        start = np.cumsum([0] + [len(s.images) for s in samples])
        by_key = {s.key: i for i, s in enumerate(samples)}
        at = 0
        for key in b["sample_keys"]:
            n = int(start[by_key[key] + 1] - start[by_key[key]])
            own[key] = pixels[at:at + n].tobytes()
            at += n
    ds = VLMDataset(root, max_tokens=MAX_TOKENS, max_images=6, image_size=SIZE, rank=0, world_size=1,
                    options=DatasetOptions(window_shards=2))
    delivered, counts, wrong = [], Counter(), []
    row = SIZE * SIZE * 3
    for n, b in enumerate(make_loader(ds, num_workers=0)):
        counts.update(b["stats"]["skipped"])
        pixels = b["pixel_values"].permute(0, 2, 3, 1).numpy()
        at = 0
        for key in b["sample_keys"]:
            k = len(own[key]) // row
            delivered.append(key)
            if pixels[at:at + k].tobytes() != own[key]:
                wrong.append(key)
            at += k
        if n == 0:            # the first window's shards are open: rotate every shard's image rows, in place
            for info in m.shards:
                path = os.path.join(root, info.name)
                images = MemmapShard(root, info).images.copy()
                with open(path, "r+b") as f:
                    f.write(np.roll(images, 1, axis=0).tobytes())
                assert os.path.getsize(path) == info.bytes
    assert wrong == []
    assert len(delivered) == len(set(delivered)) and len(delivered) + sum(counts.values()) == len(samples)
    assert counts["shard_changed"] > 0 and set(counts) <= {"shard_changed", "corrupt_shard"}
    assert pack_reads["fallback"] > 0                        # the rewritten shards' packs went the per-sample way


CFG = CollateConfig(policy=FixedPolicy(SIZE, 14), image_token_id=TOK.special.image, pad_token_id=TOK.special.pad,
                    max_tokens=4096)


def shard_in_memory(tmp_path, samples) -> MemmapShard:
    """The samples as one memmap shard, read whole into memory (as a cache's buffer holds it)."""
    root = str(tmp_path / "mm")
    info = write_dataset(root, samples, shard_size=len(samples), kind="memmap", image_size=SIZE).shards[0]
    with open(os.path.join(root, info.name), "rb") as f:
        data = f.read()
    return MemmapShard.from_buffer(data, SampleIndex.load(os.path.join(root, info.index)))


def test_pack_read_from_a_shard_in_memory_equals_its_records(tmp_path):
    """A shard held as bytes (a cache's buffer, no file to pread): the pixels are copied from it."""
    shard = shard_in_memory(tmp_path, make_samples(12, seed=8))
    rows = np.asarray([5, 0, 11, 3, 7])
    whole_stats, record_stats = StatsDelta(), StatsDelta()
    whole = read_memmap_pack({0: MemmapReader(shard.read_sample, shard, None)}, np.zeros(len(rows), np.int64), rows,
                             rows, CFG, whole_stats)
    records = [shard.read_sample(int(r)) for r in rows]
    want = build_pack(records, [r.images for r in records], CFG, record_stats)
    assert whole is not None and whole["pixel_values"].shape[0] == sum(len(r.images) for r in records) > 0
    assert_identical([whole], [want])
    assert whole_stats.to_dict() == record_stats.to_dict()


class _Rewritten:
    """Stands for the MappedShard of a file rewritten in place (`changed()` is what the reader asks)."""

    def changed(self) -> bool:
        return True


def test_a_pack_of_text_only_samples_from_a_rewritten_shard_is_not_read_whole(tmp_path):
    """Tokens come from the shard too: the rewrite check covers a pack without images."""
    shard = shard_in_memory(tmp_path, make_samples(6, seed=10, max_images=0))
    rows = np.arange(6)

    def read(mapped):
        return read_memmap_pack({0: MemmapReader(shard.read_sample, shard, mapped)}, np.zeros(6, np.int64), rows,
                                rows, CFG, StatsDelta())

    whole = read(None)
    assert whole is not None and whole["pixel_values"].shape[0] == 0 and len(whole["sample_keys"]) == 6
    assert read(_Rewritten()) is None
