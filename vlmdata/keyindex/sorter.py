"""Sorting (key, location) pairs in bounded memory, for bulk-loading LMDB in key order.

Pairs arrive in shard order and are buffered as numpy arrays (keys as an
`S` array, locations as 8-byte values). While everything fits in one buffer
of `run_keys` pairs it is sorted in memory. Beyond that, a sample sort: the
first full buffer's keys choose up to 256 key ranges (`buckets.KeyRanges`),
and every buffer is partitioned into them and spilled (`buckets.BucketStore`).
`sorted_blocks()` then reads the buckets in key order, sorts each in memory
and yields it: no merge pass. A bucket larger than `bucket_keys` pairs (keys
arriving in order, or a prefix far more common than the first buffer said)
is sorted externally instead (`runs.sort_in_runs`: runs that do not overlap
are concatenated, others merged). Equal keys stay in arrival order, i.e. by
location.

Memory: pairs held at once stay under about 2 * run_keys while adding (the
buffer being filled and the one being partitioned) and 2 * max(bucket_keys,
run_keys) while sorting (the bucket being sorted and the one being written),
plus work arrays of about the same size; `max_sorted` records the most pairs
sorted in memory at once.

`argsort_keys` sorts keys without comparing whole strings: keys are viewed
as big-endian 8-byte words after their common prefix; the first word is
sorted as integers and only the keys that tie on it go on to the next word.
Sample keys (`laion-000123456`, hex digests, `{source}-{n}`) differ within a
word or two, so this is a couple of integer sorts, about 3x faster than
numpy's string sort on keys with a long common prefix.

numpy releases the GIL while it sorts and gathers, so a buffer is
partitioned in a background thread while the next one is collected, and
`sorted_blocks()` sorts a bucket ahead in a background thread while the
caller writes the previous one: on two cores the sort runs beside the LMDB
writes.
"""
from __future__ import annotations

import queue
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from vlmdata.keyindex.buckets import BUCKETS, BucketStore, KeyRanges
from vlmdata.keyindex.runs import sort_in_runs
from vlmdata.keyindex.words import common_prefix, key_matrix, key_words

__all__ = ["KeySorter", "argsort_keys"]

RUN_KEYS = 4_000_000        # pairs buffered before they are partitioned (~150-250 MB of keys and work arrays)
BLOCK = 1 << 18             # pairs yielded per block


def argsort_keys(keys: np.ndarray) -> np.ndarray:
    """A stable argsort of an `S` array of keys, in bytewise order."""
    n = len(keys)
    if n < 2 or keys.dtype.itemsize == 0:
        return np.arange(n, dtype=np.int64)
    width = keys.dtype.itemsize
    m = key_matrix(keys)
    start = common_prefix(m)                                       # bytes every key shares are skipped
    w = key_words(m, None, start)
    order = np.argsort(w)                                          # not stable: identical keys are fixed below
    w = w[order]
    tie = np.zeros(n, bool)
    tie[1:] = w[1:] == w[:-1]
    start += 8
    while start < width and tie.any():
        group, sub = _tie_groups(tie)
        w2 = key_words(m, order[sub], start)
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

    def __init__(self, tmp_dir: str | None = None, run_keys: int = RUN_KEYS, buckets: int = BUCKETS,
                 bucket_keys: int | None = None):
        self.run_keys = int(run_keys)
        self.buckets = int(buckets)
        self.bucket_keys = int(bucket_keys or run_keys)
        self._dir = tempfile.mkdtemp(prefix="vlmdata-keysort-", dir=tmp_dir)
        self._keys: list[np.ndarray] = []
        self._vals: list[np.ndarray] = []
        self._buffered = 0
        self._store: BucketStore | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self.count = 0
        self.max_sorted = 0

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

    def _take_buffer(self) -> tuple[np.ndarray, np.ndarray]:
        keys, vals = self._keys, self._vals
        self._keys, self._vals, self._buffered = [], [], 0
        return (np.concatenate(keys) if len(keys) > 1 else keys[0]), (np.concatenate(vals) if len(vals) > 1 else vals[0])

    def _argsort(self, keys: np.ndarray) -> np.ndarray:
        self.max_sorted = max(self.max_sorted, len(keys))
        return argsort_keys(keys)

    def _sort(self, keys: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = self._argsort(keys)
        return keys[order], vals[order]

    def _spill(self) -> None:
        """Partition the buffer into the buckets on disk, in the background (one buffer at a time)."""
        self._wait()
        keys, vals = self._take_buffer()
        if self._store is None:
            self._store = BucketStore(self._dir, KeyRanges.from_sample(keys, self.buckets))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="vlmdata-keysort")
        self._pending = self._pool.submit(self._store.add, keys, vals)

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def sorted_blocks(self, block: int = BLOCK) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(keys, values) blocks covering every pair once, in key order."""
        if self._store is None:
            if self._buffered:
                keys, vals = self._sort(*self._take_buffer())
                for i in range(0, len(keys), block):
                    yield keys[i:i + block], vals[i:i + block]
            return
        if self._buffered:
            self._spill()
        self._wait()
        yield from _ahead(self._sorted_buckets(block))

    def _sorted_buckets(self, block: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        store = self._store
        for b in range(store.ranges.count):
            size = store.size(b)
            if not size:
                continue
            if size > self.bucket_keys:
                yield from sort_in_runs(store.pieces(b), self.run_keys, self._dir, block, self._argsort)
                continue
            keys, vals = self._sort(*store.read(b))
            for i in range(0, len(keys), block):
                yield keys[i:i + block], vals[i:i + block]
            del keys, vals

    def close(self) -> None:
        """Remove the spilled buckets."""
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
