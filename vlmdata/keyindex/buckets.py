"""Pairs partitioned by key range as they arrive (a sample sort), so that sorting them is one in-memory sort per
bucket and no merge pass.

`KeyRanges` cuts the key space at splitters chosen from a sample of the
first buffer of keys (its quantiles). A splitter is an 8-byte big-endian word
after the prefix every sampled key shares, so a key's bucket is one integer
`searchsorted`, not string compares; a key without that prefix is below or
above every splitter and goes to the first or the last bucket.

`BucketStore` writes each partitioned buffer as one keys file and one values
file with the buckets one after another (arrival order kept inside each), and
remembers where each bucket's piece lies, so a bucket is read back with one
read per buffer.
"""
from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from vlmdata.keyindex.words import common_prefix, key_matrix, key_words

__all__ = ["BUCKETS", "BucketStore", "KeyRanges"]

BUCKETS = 256                 # key ranges (at most 256: a bucket number is one byte)
SAMPLE_PER_BUCKET = 32        # sampled keys per splitter


class KeyRanges:
    """Consecutive key ranges: keys are cut at `prefix` + each splitter word (zero-padded comparison)."""

    def __init__(self, prefix: bytes, splitters: np.ndarray):
        self.prefix = prefix
        self.splitters = np.asarray(splitters, np.uint64)
        self.count = len(self.splitters) + 1

    @classmethod
    def from_sample(cls, keys: np.ndarray, buckets: int = BUCKETS, seed: int = 0) -> KeyRanges:
        """Up to `buckets` ranges holding about as many of `keys` each (quantiles of a random sample)."""
        if not 1 <= buckets <= 256:
            raise ValueError(f"buckets must be 1 to 256, not {buckets}")
        n = len(keys)
        take = np.random.default_rng(seed).choice(n, min(n, buckets * SAMPLE_PER_BUCKET), replace=False)
        m = key_matrix(keys[np.sort(take)])
        p = common_prefix(m)
        words = np.sort(key_words(m, None, p))
        at = np.linspace(0, len(words) - 1, buckets + 1).round().astype(np.int64)[1:-1]
        return cls(bytes(m[0, :p]), np.unique(words[at]))

    def bucket_of(self, keys: np.ndarray) -> np.ndarray:
        """Each key's range number (uint8), non-decreasing in key order."""
        p = len(self.prefix)
        m = key_matrix(keys if keys.dtype.itemsize >= p else keys.astype(f"S{p}"))
        ids = np.searchsorted(self.splitters, key_words(m, None, p), side="right").astype(np.uint8)
        if p:
            off = np.flatnonzero((m[:, :p] != np.frombuffer(self.prefix, np.uint8)).any(axis=1))
            if len(off):
                below = keys[off].astype(f"S{p}") < self.prefix
                ids[off] = np.where(below, 0, self.count - 1)
        return ids


class BucketStore:
    """Partitioned buffers of (key, value) pairs on disk, read back a bucket at a time in arrival order."""

    def __init__(self, directory: str, ranges: KeyRanges):
        self.directory = directory
        self.ranges = ranges
        self._parts: list[tuple[str, str, np.dtype, np.dtype, np.ndarray]] = []   # files, dtypes, bucket starts

    def add(self, keys: np.ndarray, vals: np.ndarray) -> None:
        """Partition and write one buffer of pairs."""
        ids = self.ranges.bucket_of(keys)
        order = np.argsort(ids, kind="stable")                      # a radix sort of bytes: arrival order kept
        starts = np.zeros(self.ranges.count + 1, np.int64)
        np.cumsum(np.bincount(ids, minlength=self.ranges.count), out=starts[1:])
        n = len(self._parts)
        paths = (os.path.join(self.directory, f"part{n:05d}.keys"), os.path.join(self.directory, f"part{n:05d}.vals"))
        keys[order].tofile(paths[0])
        vals[order].tofile(paths[1])
        self._parts.append((*paths, keys.dtype, vals.dtype, starts))

    def size(self, bucket: int) -> int:
        return int(sum(s[bucket + 1] - s[bucket] for *_, s in self._parts))

    def pieces(self, bucket: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The bucket's pairs, one piece per buffer, in arrival order."""
        for kpath, vpath, kdt, vdt, starts in self._parts:
            lo, count = int(starts[bucket]), int(starts[bucket + 1] - starts[bucket])
            if count:
                yield (np.fromfile(kpath, kdt, count, offset=lo * kdt.itemsize),
                       np.fromfile(vpath, vdt, count, offset=lo * vdt.itemsize))

    def read(self, bucket: int) -> tuple[np.ndarray, np.ndarray]:
        """The bucket's pairs at once (keys widened to the widest buffer's)."""
        got = list(self.pieces(bucket))
        if len(got) == 1:
            return got[0]
        return np.concatenate([k for k, _ in got]), np.concatenate([v for _, v in got])
