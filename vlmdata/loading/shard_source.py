"""Reading one dataset: its manifest and planning columns, shard indices ahead of use.

`open_source(root)` reads manifest.json and opens planning.npz for windowed
reads (`formats.planning.PlanningColumns`: a window's shards at a time, never
loaded whole); that is all the planner needs. Every read goes through the
dataset's retry policy (`vlmdata.retry`): a store outage costs time, and only
a failure past its deadline costs the shard. Per-shard `SampleIndex` files
are loaded in background threads a window ahead of use
(`Source.prefetch_indices`, called by the dataset when a
worker enters a window, for that window and the next), kept only while wanted
(`Source.retain_indices`), and loaded on the spot if a read comes first
(`Source.index(s)`). `Source.reader(s, data)` turns the shard's bytes, as
returned by a `ShardFetcher`, into a `read(i) -> SampleRecord` function.

Every index is checked against the shard it describes (`formats.index_checks`): an index file that
cannot be parsed or names another shard raises BadIndexError (the shard is skipped and counted), and
each tar sample's members are checked against the row's key before it is read (IndexMismatchError:
that sample is skipped and counted). A local shard is memory-mapped (`cache.MappedShard`): each sample
is copied out of the map and then the file's identity (inode, size, mtime, ctime) is compared with the
one at open, so a shard rewritten in place after it was opened costs the samples read from it afterwards
(ShardChangedError, counted as shard_changed) and never delivers bytes of the new contents under the old
index. `verify=False` turns the checks off (to measure their cost, or for
a dataset whose member names another tool wrote in a way the check does not understand).

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
from vlmdata.cache.local_shards import MappedShard
from vlmdata.errors import BadIndexError, FetchError, ShardChangedError, ShardReadError
from vlmdata.formats.index_checks import MemberCheck, check_index_file
from vlmdata.formats.manifest import PLANNING_NAME, Manifest
from vlmdata.formats.planning import PlanningColumns
from vlmdata.formats.sample import SampleRecord, TextDecoder, read_sample, text_decoder_for
from vlmdata.formats.sample_index import SampleIndex
from vlmdata.formats.text_view import ViewTokens, read_view_sample, view_planning_name, view_shard_name
from vlmdata.retry import RetryPolicy

INDEX_THREADS = 16          # concurrent index reads per process (small files, latency-bound)


@dataclass
class Source:
    """One opened dataset."""

    root: str
    manifest: Manifest
    planning: PlanningColumns
    storage_options: dict = field(default_factory=dict)
    retry: RetryPolicy | None = None      # for index reads (None: one attempt)
    verify: bool = True                   # check indices against their shards (formats.index_checks)
    _indices: dict[int, SampleIndex] = field(default_factory=dict, repr=False)
    _pending: dict[int, Future] = field(default_factory=dict, repr=False)
    _pool: ThreadPoolExecutor | None = field(default=None, repr=False)
    _pool_pid: int = field(default=-1, repr=False)
    _text: TextDecoder | None = field(default=None, repr=False)
    view_name: str = "default"                 # the text view read (manifest.view)
    view: dict = field(default_factory=dict)   # its manifest entry: tokenizer identity, where its tokens are
    _view_tokens: dict[int, ViewTokens] = field(default_factory=dict, repr=False)

    @property
    def sidecar_view(self) -> bool:
        """True when the view's tokens are files beside the shards (added by `vlmdata retokenize`)."""
        return self.view.get("tokens") == "sidecar"

    @property
    def tokenizer(self) -> dict:
        """The tokenizer identity of the view read."""
        return self.view.get("tokenizer", self.manifest.tokenizer)

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

    def _read(self, url: str) -> bytes:
        """A whole file of the dataset, under the retry policy; any failure is a FetchError."""
        try:
            return fsutil.read_bytes(url, self.storage_options, self.retry)
        except FetchError:
            raise
        except Exception as exc:  # not found, permission denied, ...: the retry policy does not retry these
            raise FetchError(f"{url}: {type(exc).__name__}: {exc}") from exc

    def _load_index(self, s: int) -> SampleIndex:
        info = self.manifest.shards[s]
        raw = self._read(fsutil.join(self.root, info.index))
        try:
            ix = SampleIndex.from_bytes(raw)
        except Exception as exc:  # truncated, empty, bad CRC, missing columns: any parse failure of the file
            raise BadIndexError(f"{info.index} cannot be read ({type(exc).__name__}: {exc}); re-create it with "
                                "`vlmdata index` or `vlmdata shard`") from exc
        if self.verify:
            check_index_file(ix, info)
        elif len(ix) != info.samples:
            raise BadIndexError(f"{info.index}: {len(ix)} samples, the manifest says {info.samples}")
        if self.sidecar_view:
            name = view_shard_name(self.view_name, info.name)
            vt = ViewTokens.from_bytes(self._read(fsutil.join(self.root, name)))
            if len(vt) != info.samples:
                raise ShardReadError(f"{name}: {len(vt)} samples, manifest says {info.samples}")
            self._view_tokens[s] = vt
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
            self._view_tokens.pop(s, None)

    def _own_process(self) -> None:
        """Threads do not survive fork: a forked copy starts with no pool and no pending loads."""
        if self._pool_pid != os.getpid():
            self._pool, self._pending, self._pool_pid = None, {}, os.getpid()

    def text_decoder(self) -> TextDecoder | None:
        """None for pre-tokenized shards, else the layout's tokenize-at-load decoder."""
        if self.manifest.layout.get("text", "tok.npy") == "tok.npy":
            return None
        if self._text is None:
            self._text = text_decoder_for(self.manifest.layout, self.tokenizer)
        return self._text

    def reader(self, s: int, data) -> Callable[[int], SampleRecord]:
        """A function reading sample i of shard s from the shard's whole bytes (for a memmap shard a
        `loading.memmap_pack.MemmapReader`, which also reads whole packs)."""
        mapped = data if isinstance(data, MappedShard) else None
        if mapped is not None:                            # before parsing it: a cut-short map faults past its end
            _check_unchanged(mapped, self.manifest.shards[s].name)
        shard = self._memmap_shard(s, data) if self.kind == "memmap" else None
        read = shard.read_sample if shard is not None else self._tar_reader(s, data)
        if mapped is not None:
            read = _unchanged(read, mapped, self.manifest.shards[s].name)
        if shard is None:
            return read
        from vlmdata.loading.memmap_pack import MemmapReader

        return MemmapReader(read, shard, mapped)

    def _memmap_shard(self, s: int, data):
        from vlmdata.formats.memmap import MemmapShard

        return MemmapShard.from_buffer(data, self.index(s))

    def _tar_reader(self, s: int, data) -> Callable[[int], SampleRecord]:
        ix = self.index(s)
        if self.manifest.layout.get("compression") == "gzip":
            try:
                data = gzip.decompress(bytes(data))
            except (OSError, EOFError, zlib.error) as exc:
                raise ShardReadError(f"shard {self.manifest.shards[s].name}: bad gzip data ({exc})") from exc
        if self.sidecar_view:
            vt = self._view_tokens[s]

            def read_one(i: int) -> SampleRecord:
                return read_view_sample(data, ix, i, vt)
        else:
            text = self.text_decoder()

            def read_one(i: int) -> SampleRecord:
                return read_sample(data, ix, i, text_decoder=text)
        if not self.verify:
            return read_one
        check = MemberCheck(ix, own_layout=self.manifest.layout.get("text", "tok.npy") == "tok.npy")

        def read(i: int) -> SampleRecord:
            check(data, i)
            return read_one(i)

        return read

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_indices"] = {}          # workers load the indices they need
        state["_pending"] = {}
        state["_pool"] = None
        state["_pool_pid"] = -1
        state["_text"] = None
        state["_view_tokens"] = {}
        return state


def _unchanged(read: Callable[[int], SampleRecord], mapped: MappedShard, name: str) -> Callable[[int], SampleRecord]:
    """`read`, each record copied out of the map and delivered only if the file was not rewritten in place.
    The file is also checked before the copy: a page of the map past the end of a file cut short in place
    would raise SIGBUS when touched (the short window between that check and the copy remains)."""

    def read_unchanged(i: int) -> SampleRecord:
        _check_unchanged(mapped, name)
        rec = read(i).detached()            # own bytes first, then: were they the checked ones?
        _check_unchanged(mapped, name)
        return rec

    return read_unchanged


def _check_unchanged(mapped: MappedShard, name: str) -> None:
    """ShardChangedError when the mapped file of shard `name` was written or truncated since it was opened."""
    if mapped.changed():
        raise ShardChangedError(f"shard {name} was rewritten in place after it was opened")


def open_source(root: str, storage_options: dict | None = None, text_view: str | None = None,
                retry: RetryPolicy | None = None, verify: bool = True) -> Source:
    """Open a dataset directory (local path or fsspec URL), reading its text view `text_view` (None: the
    dataset's default view); `retry` governs every read of it (None: one attempt each), `verify` the index
    checks."""
    so = dict(storage_options or {})
    root = root.rstrip("/") if "://" in root else root
    manifest = Manifest.load(root, so, retry)
    if manifest.kind not in ("webdataset", "memmap"):
        raise ValueError(f"{root}: unknown dataset kind {manifest.kind!r} (expected 'webdataset' or 'memmap')")
    sizes = np.asarray([s.samples for s in manifest.shards], dtype=np.int64)
    images = np.asarray([s.images for s in manifest.shards], dtype=np.int64)
    try:
        view_name, view = manifest.view(text_view)
    except KeyError as exc:
        raise ValueError(f"{root}: {exc.args[0]}") from None
    # a view written by `vlmdata retokenize` plans with its own text_tokens, read a window at a time too
    sidecar = {"text_tokens": fsutil.join(root, view_planning_name(view_name))} if view.get("tokens") == "sidecar" else {}
    try:
        planning = PlanningColumns(fsutil.join(root, PLANNING_NAME), sizes, images, so, sidecar, retry)
    except FileNotFoundError:
        if sidecar and fsutil.exists(fsutil.join(root, PLANNING_NAME), so):
            raise FileNotFoundError(f"{root}: view {view_name} has no planning columns "
                                    f"({view_planning_name(view_name)}): re-run `vlmdata retokenize` for it") from None
        raise FileNotFoundError(f"no {PLANNING_NAME} in {root}: run `vlmdata index {root}` first") from None
    return Source(root=root, manifest=manifest, planning=planning, storage_options=so, retry=retry, verify=verify,
                  view_name=view_name, view=view)
