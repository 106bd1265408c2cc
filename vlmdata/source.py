"""Reading one dataset: its manifest and planning columns up front, shard indices on demand.

`open_source(root)` does two reads (manifest.json, planning.npz) and is all the
planner needs. Per-shard `SampleIndex` files are loaded the first time a shard
is read (`Source.index(s)`), and `Source.reader(s, data)` turns the shard's
bytes, as returned by a `ShardFetcher`, into a `read(i) -> SampleRecord` function.
"""
from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from vlmdata import fsutil
from vlmdata.cache.fetch import ShardRef
from vlmdata.formats.index import SampleIndex
from vlmdata.formats.manifest import PLANNING_NAME, Manifest
from vlmdata.formats.sample import SampleRecord, TextDecoder, read_sample, text_decoder_for

PLANNING_KEYS = ("shard", "local", "text_tokens", "n_images", "image_start", "width", "height")


class ShardReadError(ValueError):
    """A fetched shard cannot be read (bad compression, index mismatch)."""


@dataclass
class Source:
    """One opened dataset."""

    root: str
    manifest: Manifest
    columns: dict[str, np.ndarray]
    storage_options: dict = field(default_factory=dict)
    _indices: dict[int, SampleIndex] = field(default_factory=dict, repr=False)
    _text: TextDecoder | None = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        return self.manifest.kind

    @property
    def num_shards(self) -> int:
        return len(self.manifest.shards)

    @property
    def num_samples(self) -> int:
        return len(self.columns["shard"])

    def shard_sizes(self) -> np.ndarray:
        return np.asarray([s.samples for s in self.manifest.shards], dtype=np.int64)

    def ref(self, s: int) -> ShardRef:
        """What to fetch for shard s: URL, size and CRC32 from the manifest."""
        info = self.manifest.shards[s]
        url = fsutil.join(self.root, info.name)
        return ShardRef(url=url, size=info.bytes, crc32=info.crc32, key=url)

    def index(self, s: int) -> SampleIndex:
        """The shard's SampleIndex (loaded once, then kept)."""
        ix = self._indices.get(s)
        if ix is None:
            info = self.manifest.shards[s]
            ix = SampleIndex.load(fsutil.join(self.root, info.index), self.storage_options)
            if len(ix) != info.samples:
                raise ShardReadError(f"{info.index}: {len(ix)} samples, manifest says {info.samples}")
            self._indices[s] = ix
        return ix

    def text_decoder(self) -> TextDecoder | None:
        """None for pre-tokenized shards, else the layout's tokenize-at-load decoder."""
        if self.manifest.layout.get("text", "tok.npy") == "tok.npy":
            return None
        if self._text is None:
            self._text = text_decoder_for(self.manifest.layout, self.manifest.tokenizer)
        return self._text

    def reader(self, s: int, data) -> Callable[[int], SampleRecord]:
        """A function reading sample i of shard s from the shard's whole bytes."""
        ix = self.index(s)
        if self.kind == "memmap":
            from vlmdata.formats.memmap import MemmapShard

            shard = MemmapShard.from_buffer(data, ix)
            return shard.read_sample
        if self.manifest.layout.get("compression") == "gzip":
            try:
                data = gzip.decompress(bytes(data))
            except (OSError, EOFError, zlib.error) as exc:
                raise ShardReadError(f"shard {self.manifest.shards[s].name}: bad gzip data ({exc})") from exc
        text = self.text_decoder()
        return lambda i: read_sample(data, ix, i, text_decoder=text)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_indices"] = {}          # workers load the indices they need
        state["_text"] = None
        return state


def load_planning(root: str, storage_options: dict | None = None) -> dict[str, np.ndarray]:
    """planning.npz as a dict of arrays (one read)."""
    raw = fsutil.read_bytes(fsutil.join(root, PLANNING_NAME), storage_options)
    with np.load(io.BytesIO(raw), allow_pickle=False) as z:
        missing = [k for k in PLANNING_KEYS if k not in z.files]
        if missing:
            raise ValueError(f"{PLANNING_NAME} in {root} lacks columns {missing}: re-run `vlmdata index`")
        return {k: z[k] for k in PLANNING_KEYS}


def open_source(root: str, storage_options: dict | None = None) -> Source:
    """Open a dataset directory (local path or fsspec URL)."""
    so = dict(storage_options or {})
    root = root.rstrip("/") if "://" in root else root
    manifest = Manifest.load(root, so)
    if manifest.kind not in ("webdataset", "memmap"):
        raise ValueError(f"{root}: unknown dataset kind {manifest.kind!r} (expected 'webdataset' or 'memmap')")
    try:
        columns = load_planning(root, so)
    except FileNotFoundError:
        raise FileNotFoundError(f"no {PLANNING_NAME} in {root}: run `vlmdata index {root}` first") from None
    sizes = np.asarray([s.samples for s in manifest.shards], dtype=np.int64)
    if int(sizes.sum()) != len(columns["shard"]):
        raise ValueError(f"{root}: {PLANNING_NAME} has {len(columns['shard'])} samples, manifest {int(sizes.sum())}")
    return Source(root=root, manifest=manifest, columns=columns, storage_options=so)
