"""Random access by sample key: where a sample lives, and the sample itself.

`find_samples(root, key)` looks the key up in the dataset's keys.lmdb and
reads each sample it names: from a plain tar only the sample's own byte
range (one ranged read, wherever the dataset is stored), from a memmap shard
its rows, from a gzip tar the whole shard (gzip has no random access).
This is the way from a batch's `sample_keys` to the samples behind a loss
spike (`VLMDataset.lookup`, `vlmdata show`).
"""
from __future__ import annotations

import gzip
import os
from dataclasses import dataclass

import numpy as np

from vlmdata import fsutil
from vlmdata.formats.manifest import Manifest
from vlmdata.formats.sample import SampleRecord, read_sample, text_decoder_for
from vlmdata.formats.sample_index import SampleIndex
from vlmdata.keyindex.build import open_dataset_keys
from vlmdata.keyindex.store import KEYS_NAME, KeyIndex

__all__ = ["FoundSample", "SampleLocation", "find_samples", "lookup_sample", "read_sample_at"]

_OPEN: dict[tuple[str, int], tuple] = {}      # (dataset URL, pid) -> (file stamp, its key index)


@dataclass(frozen=True)
class SampleLocation:
    """Where a sample lives: dataset, shard (number and file), row, and its bytes in the shard."""

    dataset: str
    shard: int
    shard_name: str
    row: int
    offset: int            # tar: first header byte of the sample; memmap: first token
    span: int              # tar: bytes through its last member; memmap: tokens

    @property
    def url(self) -> str:
        return fsutil.join(self.dataset, self.shard_name)


@dataclass
class FoundSample:
    """A sample found by key: where it is and what it holds (`record.meta` is its source record)."""

    key: str
    location: SampleLocation
    record: SampleRecord
    source: int = 0        # which dataset of a VLMDataset's mix


def _row_index(ix: SampleIndex, row: int, shift: int) -> SampleIndex:
    """A one-sample SampleIndex of `row` with byte offsets moved back by `shift`."""
    sl = ix.image_slice(row)
    meta = ix.meta_offset[row:row + 1]
    return SampleIndex(key=ix.key[row:row + 1], offset=ix.offset[row:row + 1] - shift, span=ix.span[row:row + 1],
                       tok_offset=ix.tok_offset[row:row + 1] - shift, tok_size=ix.tok_size[row:row + 1],
                       meta_offset=np.where(meta >= 0, meta - shift, meta), meta_size=ix.meta_size[row:row + 1],
                       text_tokens=ix.text_tokens[row:row + 1], n_images=ix.n_images[row:row + 1],
                       image_start=np.zeros(1, np.int64), img_offset=ix.img_offset[sl] - shift,
                       img_size=ix.img_size[sl], width=ix.width[sl], height=ix.height[sl],
                       videos=ix.videos.row(row, shift))


def read_sample_at(root: str, manifest: Manifest, shard: int, row: int, storage_options: dict | None = None,
                   index: SampleIndex | None = None) -> tuple[SampleRecord, SampleLocation]:
    """Sample `row` of shard number `shard`, with its source record, and where it lives."""
    so = storage_options or {}
    info = manifest.shards[shard]
    ix = index if index is not None else SampleIndex.load(fsutil.join(root, info.index), so)
    if not 0 <= row < len(ix):
        raise IndexError(f"{info.index} has {len(ix)} samples, no row {row}")
    offset, span = int(ix.offset[row]), int(ix.span[row])
    loc = SampleLocation(root, shard, info.name, row, offset, span)
    if manifest.kind == "memmap":
        from vlmdata.formats.memmap import MemmapShard

        return MemmapShard(root, info, so).read_sample(row, with_meta=True), loc
    text = None if manifest.layout.get("text", "tok.npy") == "tok.npy" else \
        text_decoder_for(manifest.layout, manifest.tokenizer)
    url = fsutil.join(root, info.name)
    if manifest.layout.get("compression") == "gzip":
        data = gzip.decompress(fsutil.read_bytes(url, so))
        return read_sample(data, ix, row, with_meta=True, text_decoder=text), loc
    if fsutil.is_local(url):
        with open(fsutil.local_path(url), "rb") as f:
            f.seek(offset)
            data = f.read(span)
    else:
        data = fsutil.read_range(url, offset, offset + span, so)
    if len(data) != span:
        raise ValueError(f"{url}: sample {ix.key[row].decode()} is cut short ({len(data)} of {span} bytes)")
    return read_sample(data, _row_index(ix, row, offset), 0, with_meta=True, text_decoder=text), loc


def _keys_of(root: str, manifest: Manifest, so: dict) -> KeyIndex:
    """The dataset's key index, opened once per process (again if a local one was rebuilt since)."""
    url = fsutil.join(root, KEYS_NAME)
    stamp = None
    if fsutil.is_local(url) and os.path.exists(fsutil.local_path(url)):
        st = os.stat(fsutil.local_path(url))
        stamp = (st.st_ino, st.st_mtime_ns)
    got = _OPEN.get((root, os.getpid()))
    if got is None or got[0] != stamp:
        got = _OPEN[(root, os.getpid())] = (stamp, open_dataset_keys(root, manifest, so))
    return got[1]


def find_samples(root: str, key: str, storage_options: dict | None = None,
                 manifest: Manifest | None = None) -> list[FoundSample]:
    """Every sample of the dataset with this key ([] if none; more than one only where a dataset indexed in
    place repeats a key)."""
    so = storage_options or {}
    manifest = manifest or Manifest.load(root, so)
    out = []
    for shard, row in _keys_of(root, manifest, so).locations(key):
        record, loc = read_sample_at(root, manifest, shard, row, so)
        out.append(FoundSample(key, loc, record))
    return out


def lookup_sample(root: str, key: str, storage_options: dict | None = None) -> FoundSample:
    """The sample with this key; KeyError if the dataset has none."""
    found = find_samples(root, key, storage_options)
    if not found:
        raise KeyError(f"no sample with key {key!r} in {root}")
    return found[0]
