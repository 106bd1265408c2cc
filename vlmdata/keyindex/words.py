"""Keys as big-endian 8-byte words: what the key sort and the bucket partition compare instead of strings.

A key's bytes [start, start + 8), zero-padded, read as a big-endian uint64,
order keys as their first `start + 8` bytes do (keys hold no NUL bytes, so
the padding sorts first, as a shorter key does).
"""
from __future__ import annotations

import numpy as np

__all__ = ["common_prefix", "key_matrix", "key_words"]


def key_matrix(keys: np.ndarray) -> np.ndarray:
    """An `S` array's bytes as an (n, itemsize) uint8 matrix (a view where possible)."""
    return np.ascontiguousarray(keys).view(np.uint8).reshape(len(keys), keys.dtype.itemsize)


def key_words(m: np.ndarray, rows: np.ndarray | None, start: int) -> np.ndarray:
    """Bytes [start, start + 8) of each key (row of `m`, or of `m[rows]`) as a big-endian integer."""
    width = m.shape[1]
    seg = np.zeros((len(m) if rows is None else len(rows), 8), np.uint8)
    end = min(width, start + 8)
    if end > start:
        seg[:, :end - start] = m[:, start:end] if rows is None else m[rows, start:end]
    return seg.view(">u8").ravel().astype(np.uint64)


def common_prefix(m: np.ndarray) -> int:
    """How many leading bytes every row of `m` shares (its width if all rows are equal)."""
    if not len(m):
        return 0
    same = (m == m[0]).all(axis=0)
    return m.shape[1] if same.all() else int(np.argmin(same))
