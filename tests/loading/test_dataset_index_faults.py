"""Damaged or wrong shard indices at load time: the shard (or the one row) is skipped and counted, the epoch
goes on, and no key is ever delivered with another sample's bytes."""
from __future__ import annotations

import dataclasses
import io
import os
import shutil
import zipfile
import zlib
from collections import Counter

import numpy as np
import pytest

from tests.helpers.dataset import expected_sample, make_samples, write_dataset
from vlmdata.decode import FixedPolicy
from vlmdata.formats import SampleIndex
from vlmdata.loading import DatasetOptions, VLMDataset, make_loader

MAX_TOKENS = 512
PER_IMAGE = FixedPolicy(56, 14).tokens_per_image
# the columns of an index written before indices carried their shard's checksum
OLD_COLUMNS = ("key", "offset", "span", "tok_offset", "tok_size", "meta_offset", "meta_size", "text_tokens",
               "n_images", "image_start", "img_offset", "img_size", "width", "height")


@pytest.fixture(scope="module")
def samples():
    return make_samples(48, seed=11)


def load(root, workers=2):
    """(delivered keys, skipped by reason, keys whose tokens differ from the sample's own)."""
    ds = VLMDataset(root, max_tokens=MAX_TOKENS, max_images=6, image_size=56, rank=0, world_size=1,
                    options=DatasetOptions(window_shards=2))
    keys, skipped = [], Counter()
    batches = list(make_loader(ds, num_workers=workers))
    for b in batches:
        keys += b["sample_keys"]
        skipped.update(b["stats"]["skipped"])
    return keys, dict(skipped), batches


def wrong_contents(batches, by_key) -> list[str]:
    """Keys delivered with token ids that are not their own sample's."""
    bad = []
    for b in batches:
        ids, cu = b["input_ids"].tolist(), b["cu_seqlens"].tolist()
        for j, key in enumerate(b["sample_keys"]):
            s = by_key[key]
            want, _ = expected_sample(s, [PER_IMAGE] * len(s.images))
            if ids[cu[j]:cu[j + 1]] != want[:MAX_TOKENS]:
                bad.append(key)
    return bad


def index_path(root, m, s) -> str:
    return os.path.join(root, m.shards[s].index)


def strip_checksum(path: str) -> None:
    """Rewrite an index the way vlmdata wrote them before indices named their shard's checksum."""
    with np.load(path, allow_pickle=False) as z:
        cols = {k: z[k] for k in OLD_COLUMNS}
    buf = io.BytesIO()
    np.savez(buf, **cols)
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def damage_crc(path: str) -> None:
    """Flip the last byte of one array's data inside the .npz (a zip): its CRC-32 no longer matches."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("offset.npy")
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        last = info.header_offset + 30 + name_len + extra_len + info.compress_size - 1
        f.seek(last)
        byte = f.read(1)[0]
        f.seek(last)
        f.write(bytes([byte ^ 0xFF]))


@pytest.mark.parametrize("damage", ["truncated", "empty", "bad_crc"])
def test_damaged_index_file_costs_its_shard_only(tmp_path, samples, damage):
    root = str(tmp_path / "ds")
    m = write_dataset(root, samples, shard_size=8)
    path = index_path(root, m, 2)
    if damage == "truncated":
        data = open(path, "rb").read()
        open(path, "wb").write(data[:len(data) // 2])
    elif damage == "empty":
        open(path, "wb").close()
    else:
        damage_crc(path)
    keys, skipped, _ = load(root)
    assert sorted(keys) == sorted(s.key for s in samples if s not in samples[16:24])
    assert skipped == {"bad_index": 8}


def test_swapped_index_rows_are_never_delivered_with_each_others_bytes(tmp_path, samples):
    root = str(tmp_path / "ds")
    m = write_dataset(root, samples, shard_size=8)
    path = index_path(root, m, 1)
    ix = SampleIndex.load(path)
    # two rows with the same number of images (so the per-image rows swap as blocks), keys left in place
    by_n: dict[int, list[int]] = {}
    for i in range(len(ix)):
        by_n.setdefault(int(ix.n_images[i]), []).append(i)
    a, b = next(rows for n, rows in sorted(by_n.items(), reverse=True) if len(rows) >= 2)[:2]
    swapped = {}
    for f in ("offset", "span", "tok_offset", "tok_size", "meta_offset", "meta_size", "text_tokens"):
        col = getattr(ix, f).copy()
        col[[a, b]] = col[[b, a]]
        swapped[f] = col
    sa, sb = ix.image_slice(a), ix.image_slice(b)
    for f in ("img_offset", "img_size", "width", "height"):
        col = getattr(ix, f).copy()
        col[sa], col[sb] = getattr(ix, f)[sb], getattr(ix, f)[sa]
        swapped[f] = col
    dataclasses.replace(ix, **swapped).save(path)
    keys, skipped, batches = load(root)
    by_key = {s.key: s for s in samples}
    assert wrong_contents(batches, by_key) == []
    lost = {ix.keys()[a], ix.keys()[b]}
    assert sorted(keys) == sorted(k for k in by_key if k not in lost)
    assert skipped == {"index_mismatch": 2}


def test_another_shards_index_is_refused_by_its_checksum(tmp_path, samples):
    root = str(tmp_path / "ds")
    m = write_dataset(root, samples, shard_size=8)
    shutil.copyfile(index_path(root, m, 0), index_path(root, m, 1))
    keys, skipped, batches = load(root)
    assert len(keys) == len(set(keys))                 # no key twice
    assert sorted(keys) == sorted(s.key for s in samples if s not in samples[8:16])
    assert wrong_contents(batches, {s.key: s for s in samples}) == []
    assert skipped == {"bad_index": 8}


def test_old_indices_without_checksum_load_and_are_still_checked_by_member_name(tmp_path, samples):
    root = str(tmp_path / "ds")
    m = write_dataset(root, samples, shard_size=8)
    for s in range(len(m.shards)):
        strip_checksum(index_path(root, m, s))
    keys, skipped, _ = load(root, workers=0)
    assert sorted(keys) == sorted(s.key for s in samples) and skipped == {}
    shutil.copyfile(index_path(root, m, 0), index_path(root, m, 1))   # another shard's index, no checksum
    keys, skipped, batches = load(root)
    assert len(keys) == len(set(keys))
    assert sorted(keys) == sorted(s.key for s in samples if s not in samples[8:16])
    assert wrong_contents(batches, {s.key: s for s in samples}) == []
    assert skipped == {"index_mismatch": 8}


def test_memmap_image_row_out_of_bounds_costs_one_sample(tmp_path, samples):
    root = str(tmp_path / "mm")
    m = write_dataset(root, samples, shard_size=8, kind="memmap")
    path = index_path(root, m, 0)
    ix = SampleIndex.load(path)
    row = next(i for i in range(len(ix)) if ix.n_images[i] > 0)
    img_offset = ix.img_offset.copy()
    img_offset[int(ix.image_start[row])] = -1          # would read the shard's last image
    dataclasses.replace(ix, img_offset=img_offset).save(path)
    keys, skipped, _ = load(root)
    assert sorted(keys) == sorted(s.key for s in samples if s.key != ix.keys()[row])
    assert skipped == {"index_mismatch": 1}


def memmap_pixels(batches, samples) -> dict[str, list[bytes]]:
    """key -> the bytes of each of its images as delivered (fixed policy: one [3, S, S] tensor per image)."""
    counts = {s.key: len(s.images) for s in samples}
    out = {}
    for b in batches:
        pixels = b["pixel_values"].permute(0, 2, 3, 1).contiguous().numpy()
        start = 0
        for key in b["sample_keys"]:
            n = counts[key]
            out[key] = [pixels[start + j].tobytes() for j in range(n)]
            start += n
    return out


def test_memmap_swapped_image_rows_cost_their_samples_never_deliver_swapped_pixels(tmp_path, samples):
    root = str(tmp_path / "mm")
    m = write_dataset(root, samples, shard_size=8, kind="memmap")
    _, skipped, batches = load(root, workers=0)
    own = memmap_pixels(batches, samples)
    assert skipped == {} and len(own) == len(samples)
    path = index_path(root, m, 0)
    ix = SampleIndex.load(path)
    a, b = [i for i in range(len(ix)) if ix.n_images[i] > 0][:2]
    img_offset = ix.img_offset.copy()
    ia, ib = int(ix.image_start[a]), int(ix.image_start[b])
    img_offset[ia], img_offset[ib] = img_offset[ib], img_offset[ia]    # in bounds: only an owner check sees it
    dataclasses.replace(ix, img_offset=img_offset).save(path)
    keys, skipped, batches = load(root)
    swapped = {ix.keys()[a], ix.keys()[b]}
    assert sorted(keys) == sorted(s.key for s in samples if s.key not in swapped)
    assert skipped == {"index_mismatch": 2}
    delivered = memmap_pixels(batches, samples)
    assert [k for k in delivered if delivered[k] != own[k]] == []
    assert wrong_contents(batches, {s.key: s for s in samples}) == []


def test_memmap_shards_without_owners_stay_readable_unverified(tmp_path, samples):
    """A version-1 shard (written before image owners) loads; MemmapShard.verified says it is unchecked."""
    import json
    import struct

    from vlmdata.formats import TRAILER, Manifest, MemmapShard

    root = str(tmp_path / "mm")
    write_dataset(root, samples, shard_size=8, kind="memmap")
    man = Manifest.load(root)
    for info in man.shards:
        path = os.path.join(root, info.name)
        data = open(path, "rb").read()
        _, n = TRAILER.unpack(data[-TRAILER.size:])
        footer = json.loads(data[-TRAILER.size - n:-TRAILER.size])
        del footer["offsets"]["owners"]
        footer["version"] = 1
        raw = json.dumps(footer, sort_keys=True).encode()
        rewritten = data[:-TRAILER.size - n] + raw + struct.pack("<8sQ", b"VLMMMAP1", len(raw))
        with open(path, "wb") as f:
            f.write(rewritten)
        info.bytes, info.crc32 = len(rewritten), zlib.crc32(rewritten)
        ix = SampleIndex.load(os.path.join(root, info.index))
        dataclasses.replace(ix, shard_bytes=info.bytes, shard_crc32=info.crc32).save(os.path.join(root, info.index))
    man.save(root)
    assert not MemmapShard(root, man.shards[0]).verified
    keys, skipped, _ = load(root)
    assert sorted(keys) == sorted(s.key for s in samples) and skipped == {}
