"""Reading one dataset: its manifest and planning columns, shard indices ahead of use.

`open_source(root)` reads manifest.json and opens planning.npz for windowed
reads (`formats.planning.PlanningColumns`: a window's shards at a time, never
loaded whole); that is all the planner needs. Per-shard `SampleIndex` files
are loaded in background threads a window ahead of use
(`Source.prefetch_indices`, called by the dataset when a
worker enters a window, for that window and the next), kept only while wanted
(`Source.retain_indices`), and loaded on the spot if a read comes first
(`Source.index(s)`). `Source.reader(s, data)` turns the shard's bytes, as
returned by a `ShardFetcher`, into a `read(i) -> SampleRecord` function.

Why a window ahead in each worker, not all indices up front in the main process:
an index costs ~100-130 bytes per sample (offsets, sizes, key), so a 10k-shard
dataset of 5000-sample shards holds 5-6 GB of indices, copied into every spawned
DataLoader worker of every rank, and reading 10k files before the first batch
(16 threads x 100 ms per request on a slow store) delays it by about a minute.
Windows are what a worker reads next (its packs draw from the window's
shards), so loading window k + 1's indices in parallel while window k is read
hides the store's latency at a memory cost of two windows of indices.
Going through the ShardFetcher was not chosen either: index files have no
size/CRC in the manifest and would take cache space meant for shards.
"""
from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from vlmdata import fsutil
from vlmdata.cache.fetch import ShardRef
from vlmdata.errors import ShardReadError
from vlmdata.formats.manifest import PLANNING_NAME, Manifest
from vlmdata.formats.planning import PlanningColumns
from vlmdata.formats.sample import SampleRecord, TextDecoder, read_sample, text_decoder_for
from vlmdata.formats.sample_index import SampleIndex

INDEX_THREADS = 16          # concurrent index reads per process (small files, latency-bound)


@dataclass
class Source:
    """One opened dataset."""

    root: str
    manifest: Manifest
    planning: PlanningColumns
    storage_options: dict = field(default_factory=dict)
    _indices: dict[int, SampleIndex] = field(default_factory=dict, repr=False)
    _pending: dict[int, Future] = field(default_factory=dict, repr=False)
    _pool: ThreadPoolExecutor | None = field(default=None, repr=False)
    _pool_pid: int = field(default=-1, repr=False)
    _text: TextDecoder | None = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        return self.manifest.kind

    @property
    def num_shards(self) -> int:
        return len(self.manifest.shards)

    @property
    def num_samples(self) -> int:
        return self.planning.num_samples

    def shard_sizes(self) -> np.ndarray:
        return np.asarray([s.samples for s in self.manifest.shards], dtype=np.int64)

    def ref(self, s: int) -> ShardRef:
        """What to fetch for shard s: URL, size and CRC32 from the manifest."""
        info = self.manifest.shards[s]
        url = fsutil.join(self.root, info.name)
        return ShardRef(url=url, size=info.bytes, crc32=info.crc32, key=url)

    def index(self, s: int) -> SampleIndex:
        """The shard's SampleIndex: kept, or prefetched (waits for it), or loaded now."""
        ix = self._indices.get(s)
        if ix is None:
            self._own_process()
            pending = self._pending.pop(s, None)
            ix = pending.result() if pending is not None else self._load_index(s)
            self._indices[s] = ix
        return ix

    def _load_index(self, s: int) -> SampleIndex:
        info = self.manifest.shards[s]
        ix = SampleIndex.load(fsutil.join(self.root, info.index), self.storage_options)
        if len(ix) != info.samples:
            raise ShardReadError(f"{info.index}: {len(ix)} samples, manifest says {info.samples}")
        return ix

    def prefetch_indices(self, shards: Iterable[int]) -> None:
        """Start loading these shards' indices in background threads (errors surface in `index`)."""
        self._own_process()
        for s in shards:
            s = int(s)
            if s in self._indices or s in self._pending:
                continue
            if self._pool is None:
                self._pool = ThreadPoolExecutor(INDEX_THREADS, thread_name_prefix="vlmdata-index")
            self._pending[s] = self._pool.submit(self._load_index, s)

    def retain_indices(self, shards: Iterable[int]) -> None:
        """Forget loaded indices of shards not in `shards` (bounds memory to the windows in use)."""
        keep = {int(s) for s in shards}
        for s in [s for s in self._indices if s not in keep]:
            del self._indices[s]

    def _own_process(self) -> None:
        """Threads do not survive fork: a forked copy starts with no pool and no pending loads."""
        if self._pool_pid != os.getpid():
            self._pool, self._pending, self._pool_pid = None, {}, os.getpid()

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
        state["_pending"] = {}
        state["_pool"] = None
        state["_pool_pid"] = -1
        state["_text"] = None
        return state


def open_source(root: str, storage_options: dict | None = None) -> Source:
    """Open a dataset directory (local path or fsspec URL)."""
    so = dict(storage_options or {})
    root = root.rstrip("/") if "://" in root else root
    manifest = Manifest.load(root, so)
    if manifest.kind not in ("webdataset", "memmap"):
        raise ValueError(f"{root}: unknown dataset kind {manifest.kind!r} (expected 'webdataset' or 'memmap')")
    sizes = np.asarray([s.samples for s in manifest.shards], dtype=np.int64)
    images = np.asarray([s.images for s in manifest.shards], dtype=np.int64)
    try:
        planning = PlanningColumns(fsutil.join(root, PLANNING_NAME), sizes, images, so)
    except FileNotFoundError:
        raise FileNotFoundError(f"no {PLANNING_NAME} in {root}: run `vlmdata index {root}` first") from None
    return Source(root=root, manifest=manifest, planning=planning, storage_options=so)
