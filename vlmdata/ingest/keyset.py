"""A compact set of sample keys for duplicate detection over millions of rows.

Keys are stored as 64-bit BLAKE2b digests: recent ones in a Python set,
older ones merged into one sorted numpy array (8 bytes per key), so ten
million keys take ~80 MB instead of gigabytes of Python strings.
"""
from __future__ import annotations

import hashlib

import numpy as np


def key_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little", signed=True)


class KeySet:
    """`add(key)` returns False if the key was already added."""

    def __init__(self, flush_every: int = 1 << 18):
        self._sorted = np.zeros(0, np.int64)
        self._recent: set[int] = set()
        self._flush_every = flush_every

    def __len__(self) -> int:
        return len(self._sorted) + len(self._recent)

    def add(self, key: str) -> bool:
        h = key_hash(key)
        if h in self._recent:
            return False
        if len(self._sorted):
            i = int(np.searchsorted(self._sorted, h))
            if i < len(self._sorted) and self._sorted[i] == h:
                return False
        self._recent.add(h)
        if len(self._recent) >= self._flush_every:
            merged = np.concatenate([self._sorted, np.fromiter(self._recent, np.int64, len(self._recent))])
            merged.sort(kind="stable")
            self._sorted = merged
            self._recent = set()
        return True
