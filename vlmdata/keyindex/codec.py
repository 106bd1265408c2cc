"""How sample keys and their locations are written in LMDB: key bytes, and (shard, row) as 8 bytes.

LMDB orders keys bytewise (memcmp, shorter first on a common prefix), which is
also how numpy orders `S` arrays of keys without NUL bytes, so keys sorted
with numpy can be appended in order. Keys longer than LMDB's limit (511
bytes) are stored as a marker byte and their BLAKE2b-256 hex digest. A
location is the shard's number in the manifest and the sample's row in that
shard, both big-endian uint32, so that the duplicates of one key sort by
shard, then row.
"""
from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["MAX_KEY_BYTES", "decode_location", "encode_key", "encode_keys", "encode_locations"]

MAX_KEY_BYTES = 480            # below LMDB's 511-byte limit
LONG_KEY = b"\x1f"             # never the first byte of a real key (a control character)
LOCATION = np.dtype([("shard", ">u4"), ("row", ">u4")])


def encode_key(key: str | bytes) -> bytes:
    """The LMDB key of a sample key."""
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if len(raw) > MAX_KEY_BYTES or raw.startswith(LONG_KEY) or b"\x00" in raw:
        return LONG_KEY + hashlib.blake2b(raw, digest_size=32).hexdigest().encode()
    return raw


def encode_keys(keys: np.ndarray) -> np.ndarray:
    """`encode_key` over an `S` array (what a SampleIndex stores); an `S` array back, copied only if needed."""
    keys = np.asarray(keys)
    if keys.dtype.kind != "S":
        keys = np.asarray([k.encode("utf-8") if isinstance(k, str) else bytes(k) for k in keys.tolist()], dtype="S")
    if not len(keys):
        return keys
    raw = keys.view(np.uint8).reshape(len(keys), keys.dtype.itemsize)
    # a NUL inside a key (not the padding after it) or a key needing a digest is rare: handle those one by one
    lengths = np.char.str_len(keys)
    inner_nul = (raw == 0).sum(axis=1) != keys.dtype.itemsize - lengths
    special = inner_nul | (lengths > MAX_KEY_BYTES) | (raw[:, 0] == LONG_KEY[0])
    if not special.any():
        return keys
    return np.asarray([encode_key(k) for k in keys.tolist()], dtype="S")   # tolist keeps inner NULs


def encode_locations(shard, rows) -> np.ndarray:
    """8-byte values (void array) for (shard, row) pairs."""
    rows = np.asarray(rows)
    out = np.empty(len(rows), LOCATION)
    out["shard"] = shard
    out["row"] = rows
    return out.view("V8")


def decode_location(value: bytes) -> tuple[int, int]:
    """(shard, row) of an 8-byte value."""
    return int.from_bytes(value[:4], "big"), int.from_bytes(value[4:8], "big")
