"""External sort of (key, location) pairs in bounded memory, for bulk-loading LMDB in key order.

Pairs arrive in shard order. They are buffered as numpy arrays (keys as an
`S` array, locations as 8-byte values), sorted in runs of `run_keys` pairs
and spilled to `.npy` files; `sorted_blocks()` merges the runs (memory-mapped)
into blocks in key order. Equal keys stay in arrival order, i.e. by
location, except where one key's copies straddle two merged blocks (the
loader copes with that; see `store.write_key_index`).

`argsort_keys` sorts keys without comparing whole strings: keys are viewed
as big-endian 8-byte words after their common prefix; the first word is
sorted as integers and only the keys that tie on it go on to the next word.
Sample keys (`laion-000123456`, hex digests, `{source}-{n}`) differ within a
word or two, so this is a couple of integer sorts, about 3x faster than
numpy's string sort on keys with a long common prefix.

Merging reads a block of every run, takes from each run the keys up to the
smallest last key among the blocks (nothing later in any run can come
before it), and orders them with a stable sort, which for a concatenation
of sorted pieces is a merge.

numpy releases the GIL while it sorts and gathers, so a run is sorted in a
background thread while the next one is collected, and `sorted_blocks()`
merges a block ahead in a background thread while the caller writes the
previous one: on two cores the sort runs beside the LMDB writes.
"""
from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

__all__ = ["KeySorter", "argsort_keys"]

RUN_KEYS = 4_000_000        # pairs sorted and spilled at a time (~150-250 MB of keys and work arrays)
BLOCK = 1 << 18             # pairs yielded per block (and read from each run per merge step, at most)
MERGE_BYTES = 128 << 20     # what the merge reads at a time from all runs together (bounds its memory)


class _RunFile:
    """A spilled .npy run read a block at a time with plain reads (a memory map would keep every page it
    touched in the process's RSS)."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            np.lib.format.read_magic(f)
            shape, _, self.dtype = np.lib.format.read_array_header_1_0(f)
            self.offset = f.tell()
        self.n = int(shape[0])

    def read(self, start: int, count: int) -> np.ndarray:
        return np.fromfile(self.path, dtype=self.dtype, count=count, offset=self.offset + start * self.dtype.itemsize)


def _words(m: np.ndarray, rows: np.ndarray | None, start: int) -> np.ndarray:
    """Bytes [start, start + 8) of each key as a big-endian integer (zero-padded)."""
    width = m.shape[1]
    seg = np.zeros((len(m) if rows is None else len(rows), 8), np.uint8)
    end = min(width, start + 8)
    if end > start:
        seg[:, :end - start] = m[:, start:end] if rows is None else m[rows, start:end]
    return seg.view(">u8").ravel().astype(np.uint64)


def argsort_keys(keys: np.ndarray) -> np.ndarray:
    """A stable argsort of an `S` array of keys, in bytewise order."""
    n = len(keys)
    if n < 2 or keys.dtype.itemsize == 0:
        return np.arange(n, dtype=np.int64)
    width = keys.dtype.itemsize
    m = np.ascontiguousarray(keys).view(np.uint8).reshape(n, width)
    same = (m == m[0]).all(axis=0)
    start = width if same.all() else int(np.argmin(same))         # bytes every key shares are skipped
    w = _words(m, None, start)
    order = np.argsort(w)                                          # not stable: identical keys are fixed below
    w = w[order]
    tie = np.zeros(n, bool)
    tie[1:] = w[1:] == w[:-1]
    start += 8
    while start < width and tie.any():
        group, sub = _tie_groups(tie)
        w2 = _words(m, order[sub], start)
        o = np.lexsort((w2, group[sub]))                           # within a group, by the next word
        order[sub] = order[sub][o]
        w2, g = w2[o], group[sub][o]
        t = np.zeros(len(sub), bool)
        t[1:] = (w2[1:] == w2[:-1]) & (g[1:] == g[:-1])
        tie = np.zeros(n, bool)
        tie[sub] = t
        start += 8
    if tie.any():                                                  # identical keys: in arrival order
        group, sub = _tie_groups(tie)
        order[sub] = order[sub][np.lexsort((order[sub], group[sub]))]
    return order.astype(np.int64)


def _tie_groups(tie: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group number of every position, positions in a group of two or more) for a run-of-equals mask."""
    group = np.cumsum(~tie) - 1
    member = tie.copy()
    member[:-1] |= tie[1:]
    return group, np.flatnonzero(member)


class KeySorter:
    """Collects (key, location) pairs and yields them in key order (see the module docstring)."""

    def __init__(self, tmp_dir: str | None = None, run_keys: int = RUN_KEYS):
        self.run_keys = int(run_keys)
        self._dir = tempfile.mkdtemp(prefix="vlmdata-keysort-", dir=tmp_dir)
        self._keys: list[np.ndarray] = []
        self._vals: list[np.ndarray] = []
        self._buffered = 0
        self._runs: list[tuple[str, str]] = []
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self.count = 0

    def add(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Add pairs: `keys` an `S` array, `values` an 8-byte void array of the same length."""
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")
        if not len(keys):
            return
        self._keys.append(np.asarray(keys))
        self._vals.append(np.asarray(values))
        self._buffered += len(keys)
        self.count += len(keys)
        if self._buffered >= self.run_keys:
            self._spill()

    def _take_buffer(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        parts = (self._keys, self._vals)
        self._keys, self._vals, self._buffered = [], [], 0
        return parts

    @staticmethod
    def _sort(keys: list[np.ndarray], vals: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        k = np.concatenate(keys) if len(keys) > 1 else keys[0]
        v = np.concatenate(vals) if len(vals) > 1 else vals[0]
        order = argsort_keys(k)
        return k[order], v[order]

    def _spill(self) -> None:
        """Sort and write the buffer as a run, in the background (one run at a time)."""
        self._wait()
        n = len(self._runs)
        paths = (os.path.join(self._dir, f"run{n:05d}.keys.npy"), os.path.join(self._dir, f"run{n:05d}.vals.npy"))
        self._runs.append(paths)
        keys, vals = self._take_buffer()

        def work() -> None:
            k, v = self._sort(keys, vals)
            np.save(paths[0], k)
            np.save(paths[1], v)

        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="vlmdata-keysort")
        self._pending = self._pool.submit(work)

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def sorted_blocks(self, block: int = BLOCK) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(keys, values) blocks covering every pair once, in key order."""
        if not self._runs:
            if self._buffered:
                keys, vals = self._sort(*self._take_buffer())
                for i in range(0, len(keys), block):
                    yield keys[i:i + block], vals[i:i + block]
            return
        if self._buffered:
            self._spill()
        self._wait()
        yield from _ahead(self._merge(block))

    def _merge(self, block: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        runs = [(_RunFile(k), _RunFile(v)) for k, v in self._runs]
        width = max(r[0].dtype.itemsize for r in runs) + 8
        block = max(1024, min(block, MERGE_BYTES // (width * len(runs))))
        pos = [0] * len(runs)
        heads: dict[int, np.ndarray] = {}                # the unread rest of each run's current block
        while True:
            live = [r for r in range(len(runs)) if pos[r] < runs[r][0].n]
            if not live:
                return
            for r in live:
                if len(heads.get(r, ())) == 0:
                    heads[r] = runs[r][0].read(pos[r], min(block, runs[r][0].n - pos[r]))
            bound = None
            for r in live:
                if pos[r] + len(heads[r]) < runs[r][0].n:
                    last = heads[r][-1]
                    bound = last if bound is None or last < bound else bound
            keys, vals = [], []
            for r in live:
                ks = heads[r]
                take = len(ks) if bound is None else int(np.searchsorted(ks, bound, side="right"))
                keys.append(ks[:take])
                vals.append(runs[r][1].read(pos[r], take))
                heads[r] = ks[take:]
                pos[r] += take
            keys_cat, vals_cat = np.concatenate(keys), np.concatenate(vals)
            if len(keys_cat):
                order = np.argsort(keys_cat, kind="stable")
                keys_cat, vals_cat = keys_cat[order], vals_cat[order]
                for i in range(0, len(keys_cat), BLOCK):
                    yield keys_cat[i:i + BLOCK], vals_cat[i:i + BLOCK]

    def close(self) -> None:
        """Remove the spilled runs."""
        try:
            self._wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> KeySorter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_DONE = object()


def _ahead(blocks: Iterator, depth: int = 2) -> Iterator:
    """Iterate `blocks` in a background thread, `depth` items ahead (exceptions re-raised here)."""
    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in blocks:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as exc:          # handed to the consumer
            put(exc)

    thread = threading.Thread(target=produce, name="vlmdata-keymerge", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()
