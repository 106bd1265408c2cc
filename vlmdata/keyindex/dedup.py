"""Duplicate keys at shard time, in one pass and bounded memory: `SeenKeys`, a small log-structured set.

First occurrence wins: as a sharding run streams its rows, each job's keys
are checked against every key seen earlier in the run, and new keys are
recorded with the number of the row (in the run's input stream) that had
them first. Keys already in other datasets (`--dedup-against`) are looked
up in those datasets' keys.lmdb by the caller (read-only).

A key is kept as its 128-bit BLAKE2b digest (16 bytes; two different keys
share one with probability ~n^2 / 2^129, about 10^-21 at 10^9 keys, where the
64-bit hash set this replaces lost a sample by chance with probability ~3 %):

* the newest keys in a dict in memory (`memtable` entries, ~150 MB at 2^20);
* when it fills, they are sorted and written as a run: a file of
  (hi, lo, row) records sorted by digest, with in memory one fence (the
  first digest) per 512-record block and a blocked Bloom filter (one 64-bit
  word per key, 10 bits per key, ~1-2 % false positives);
* when `fanout` runs of the same size class pile up they are merged into
  one (streamed, a block of each at a time), so a run count stays about
  fanout x log_fanout(keys / memtable).

Checking a key: the dict; then, for each run whose filter says maybe, one
12 KB positioned read of the block its fence names. New keys are only ever
written sequentially (flushes, merges), unlike a B-tree probed per row,
which rewrites a random leaf for most inserts (measured with LMDB, 1000-row
transactions: ~5 KB written per row at 3M rows, growing with the tree).
Memory: the dict, ~1.3 bytes per key of filters and fences (~130 MB at
10^8 keys), a block per run while merging; the runs (24 bytes per key) are
on disk and read with pread, so they are page cache, not process memory.

A run is rebuilt from scratch when a sharding run resumes: its rows are
streamed again from the start, so the same keys meet the same earlier rows
and every decision comes out the same.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass

import numpy as np

from vlmdata.keyindex.codec import encode_key
from vlmdata.keyindex.store import KeyIndex

__all__ = ["IN_RUN", "RunDedup", "SeenKeys", "digests"]

IN_RUN = ""                   # `RunDedup.mark` result: an earlier row of the run had the key

RECORD = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("row", "<i8")])
BLOCK = 512                   # records per fence (one 12 KB read per lookup)
MERGE_BLOCK = 1 << 16         # records read from each run per merge step
BITS_PER_KEY = 10
_SHIFTS = np.arange(7, dtype=np.uint64) * np.uint64(9)     # 7 bits per key, from 9-bit slices of `hi`


def digests(keys: list[str]) -> list[bytes]:
    """128-bit BLAKE2b digests of the keys' UTF-8 bytes."""
    return [hashlib.blake2b(k.encode("utf-8"), digest_size=16).digest() for k in keys]


def _split(ds: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    pairs = np.frombuffer(b"".join(ds), dtype="<u8").reshape(-1, 2)
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def _masks(hi: np.ndarray) -> np.ndarray:
    bits = (hi[:, None] >> _SHIFTS[None, :]) & np.uint64(63)
    return np.bitwise_or.reduce(np.uint64(1) << bits, axis=1)


class _Filter:
    """A blocked Bloom filter: each key sets 7 bits of one 64-bit word."""

    def __init__(self, n: int):
        self.words = np.zeros(max(1, -(-n * BITS_PER_KEY // 64)), np.uint64)

    def add(self, hi: np.ndarray, lo: np.ndarray) -> None:
        np.bitwise_or.at(self.words, lo % np.uint64(len(self.words)), _masks(hi))

    def maybe(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        m = _masks(hi)
        return (self.words[lo % np.uint64(len(self.words))] & m) == m


@dataclass
class _Run:
    path: str
    n: int
    fence_hi: np.ndarray
    fence_lo: np.ndarray
    filter: _Filter
    fd: int = -1

    def read(self, start: int, count: int) -> np.ndarray:
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_RDONLY)
        raw = os.pread(self.fd, count * RECORD.itemsize, start * RECORD.itemsize)
        return np.frombuffer(raw, RECORD)

    def find(self, hi: int, lo: int) -> int:
        """The recorded row of digest (hi, lo), or -1."""
        b = int(np.searchsorted(self.fence_hi, np.uint64(hi), side="right")) - 1
        while b > 0 and self.fence_hi[b] == hi and self.fence_lo[b] > lo:
            b -= 1
        if b < 0:
            return -1
        block = self.read(b * BLOCK, min(BLOCK, self.n - b * BLOCK))
        i = int(np.searchsorted(block["hi"], np.uint64(hi), side="left"))
        while i < len(block) and block["hi"][i] == hi:
            if block["lo"][i] == lo:
                return int(block["row"][i])
            i += 1
        return -1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _RunWriter:
    """Writes sorted records to a run file, keeping its fences and filter."""

    def __init__(self, path: str, n: int):
        self.path = path
        self.file = open(path, "wb")
        self.filter = _Filter(n)
        self.fences_hi: list[np.ndarray] = []
        self.fences_lo: list[np.ndarray] = []
        self.n = 0

    def write(self, records: np.ndarray) -> None:
        if not len(records):
            return
        first = (-self.n) % BLOCK                      # first record of this chunk that starts a block
        # copies: a strided view would keep the whole chunk alive until the run is closed
        self.fences_hi.append(records["hi"][first::BLOCK].copy())
        self.fences_lo.append(records["lo"][first::BLOCK].copy())
        self.filter.add(records["hi"], records["lo"])
        self.file.write(records.tobytes())
        self.n += len(records)

    def close(self) -> _Run:
        self.file.close()
        cat = (lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.uint64))  # noqa: E731
        return _Run(self.path, self.n, cat(self.fences_hi), cat(self.fences_lo), self.filter)


def _upto(block: np.ndarray, hi: int, lo: int) -> int:
    """How many records of a sorted block are <= (hi, lo)."""
    a = int(np.searchsorted(block["hi"], np.uint64(hi), side="left"))
    b = int(np.searchsorted(block["hi"], np.uint64(hi), side="right"))
    return a + int(np.searchsorted(block["lo"][a:b], np.uint64(lo), side="right"))


class SeenKeys:
    """Keys seen so far in one sharding run (see the module docstring). Files live in `directory`,
    emptied when the set is made and removed by `remove()`."""

    def __init__(self, directory: str, memtable: int = 1 << 20, fanout: int = 8):
        self.directory = directory
        self.memtable = int(memtable)
        self.fanout = max(2, int(fanout))
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        self._mem: dict[bytes, int] = {}
        self._runs: list[_Run] = []                    # oldest first
        self._next = 0
        self.count = 0

    def __len__(self) -> int:
        return self.count

    @property
    def runs(self) -> int:
        return len(self._runs)

    def first_rows(self, keys: list[str], rows: list[int]) -> list[int]:
        """For each key (with its row number, in stream order): the row that had it first. A key not seen
        before is recorded with its own row, so `result[i] != rows[i]` marks the duplicates."""
        ds = digests(keys)
        out = [self._mem.get(d, -1) for d in ds]
        pending = [i for i, r in enumerate(out) if r < 0]
        if pending and self._runs:
            hi, lo = _split([ds[i] for i in pending])
            left = np.ones(len(pending), bool)
            for run in reversed(self._runs):
                maybe = np.flatnonzero(left & run.filter.maybe(hi, lo))
                for j in maybe.tolist():
                    row = run.find(int(hi[j]), int(lo[j]))
                    if row >= 0:
                        out[pending[j]] = row
                        left[j] = False
        for i in pending:
            if out[i] < 0:
                first = self._mem.get(ds[i])           # an earlier key of this batch
                if first is None:
                    first = self._mem[ds[i]] = int(rows[i])
                    self.count += 1
                out[i] = first
        if len(self._mem) >= self.memtable:
            self._flush()
        return out

    def _flush(self) -> None:
        hi, lo = _split(list(self._mem))
        records = np.empty(len(hi), RECORD)
        records["hi"], records["lo"], records["row"] = hi, lo, list(self._mem.values())
        records = records[np.lexsort((lo, hi))]
        self._mem = {}
        w = _RunWriter(self._path(), len(records))
        w.write(records)
        self._runs.append(w.close())
        self._compact()

    def _path(self) -> str:
        self._next += 1
        return os.path.join(self.directory, f"run{self._next:06d}.keys")

    def _level(self, run: _Run) -> int:
        level, size = 0, self.memtable * self.fanout
        while run.n >= size:
            level, size = level + 1, size * self.fanout
        return level

    def _compact(self) -> None:
        while len(self._runs) >= self.fanout:
            tail = self._runs[-self.fanout:]
            if len({self._level(r) for r in tail}) != 1:
                return
            merged = self._merge(tail)
            for r in tail:
                r.close()
                os.unlink(r.path)
            self._runs[-self.fanout:] = [merged]

    def _merge(self, runs: list[_Run]) -> _Run:
        w = _RunWriter(self._path(), sum(r.n for r in runs))
        pos = [0] * len(runs)
        while True:
            live = [i for i, r in enumerate(runs) if pos[i] < r.n]
            if not live:
                return w.close()
            blocks = {i: runs[i].read(pos[i], min(MERGE_BLOCK, runs[i].n - pos[i])) for i in live}
            bound = None
            for i in live:
                if pos[i] + len(blocks[i]) < runs[i].n:
                    last = (int(blocks[i]["hi"][-1]), int(blocks[i]["lo"][-1]))
                    bound = last if bound is None or last < bound else bound
            parts = []
            for i in live:
                take = len(blocks[i]) if bound is None else _upto(blocks[i], *bound)
                parts.append(blocks[i][:take])
                pos[i] += take
            cat = np.concatenate(parts)
            w.write(cat[np.lexsort((cat["lo"], cat["hi"]))])

    def close(self) -> None:
        for r in self._runs:
            r.close()

    def remove(self) -> None:
        """Close and delete the set's files."""
        self.close()
        self._runs = []
        shutil.rmtree(self.directory, ignore_errors=True)


class RunDedup:
    """Duplicate marking for a sharding run: its SeenKeys, and the key indices of the datasets it must not
    repeat (`against`: (name, KeyIndex) pairs)."""

    def __init__(self, directory: str, against: list[tuple[str, KeyIndex]] | None = None, memtable: int = 1 << 20):
        self.against = list(against or [])
        self.seen = SeenKeys(directory, memtable)

    def mark(self, keys: list[str], rows: list[int]) -> list[str | None]:
        """Per key (rows: their numbers in the stream, increasing): None (first occurrence, recorded),
        IN_RUN (an earlier row had it) or the name of the `against` dataset that holds it."""
        out: list[str | None] = [None] * len(keys)
        if self.against:
            enc = [encode_key(k) for k in keys]
            for name, index in self.against:
                for i, hit in enumerate(index.contains_encoded(enc)):
                    if hit and out[i] is None:
                        out[i] = name
        fresh = [i for i, o in enumerate(out) if o is None]
        firsts = self.seen.first_rows([keys[i] for i in fresh], [rows[i] for i in fresh])
        for i, first in zip(fresh, firsts):
            if first != rows[i]:
                out[i] = IN_RUN
        return out

    def remove(self) -> None:
        self.seen.remove()
