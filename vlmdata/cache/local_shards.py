"""Local shards are memory-mapped, not read: the page cache is their cache.

`map_local_shard(ref)` maps the file read-only (an mmap, which the sample readers slice
without copying) after checking its size against the manifest, and checks its CRC32 only on
the first open of this file in this process tree (`cache.verified`). Reading the whole shard
into private memory instead cost a full copy per open and made every DataLoader worker hold
its windows of shards privately (tools/profile_loader.py, BENCHMARKS.md issue 16).
"""
from __future__ import annotations

import mmap
import os
import zlib

from vlmdata.cache.verified import VERIFIED, file_identity
from vlmdata.errors import CorruptShardError

__all__ = ["map_local_shard"]


def map_local_shard(path: str, size: int | None, crc32: int | None, label: str | None = None):
    """A read-only mmap of the shard at `path` (b"" when empty), verified as described above.

    Raises CorruptShardError for a size or CRC32 mismatch, FileNotFoundError if it is missing.
    """
    label = label or path
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if size is not None and st.st_size != size:
            raise CorruptShardError(f"{label}: {st.st_size} bytes, expected {size}")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if st.st_size else b""
    if crc32 is not None:
        ident = file_identity(path, st, crc32)
        if ident not in VERIFIED:
            crc = zlib.crc32(data) & 0xFFFFFFFF
            if crc != crc32:
                raise CorruptShardError(f"{label}: crc32 {crc:#010x}, expected {crc32:#010x}")
            VERIFIED.add(ident)
    return data
