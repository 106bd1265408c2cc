"""Local shards are memory-mapped, not read: the page cache is their cache.

`map_local_shard(ref)` maps the file read-only (an mmap, which the sample readers slice
without copying) after checking its size against the manifest, and checks its CRC32 only on
the first open of this file in this process tree (`cache.verified`), reading the file (not the
map) for it, so the check leaves no page of the shard mapped in the process. Reading the whole shard
into private memory instead cost a full copy per open and made every DataLoader worker hold
its windows of shards privately (tools/profile_loader.py, BENCHMARKS.md issue 16).

A map shows the file's current bytes: a shard *replaced* by a new file (rename) leaves the map
on the old inode, still the checked bytes, but one *rewritten in place* changes under it. So the
map is a `MappedShard`, which keeps the file open and tells, by `changed()` (one fstat: inode,
size, modification and status-change times against those at open), whether the bytes may differ
from the checked ones. The sample readers copy a sample's bytes out, then ask (shard_source):
a sample read after an in-place rewrite is skipped and counted (shard_changed), never delivered.
"""
from __future__ import annotations

import mmap
import os
import zlib

from vlmdata.cache.verified import VERIFIED, file_identity
from vlmdata.errors import CorruptShardError

__all__ = ["MappedShard", "map_local_shard"]


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class MappedShard(mmap.mmap):
    """A read-only map of a local shard that knows whether its file changed since it was opened."""

    def __new__(cls, f, st: os.stat_result):
        self = super().__new__(cls, f.fileno(), 0, access=mmap.ACCESS_READ)
        self._fd = os.dup(f.fileno())          # fstat follows the mapped inode, not whatever the path names now
        self._identity = _identity(st)
        return self

    def changed(self) -> bool:
        """True when the mapped file was written (or truncated) after it was opened."""
        return _identity(os.fstat(self._fd)) != self._identity

    def read_into(self, dst, offset: int) -> int:
        """Copy the file's bytes at `offset` into the writable buffer `dst` with pread (the kernel copies
        from the page cache: no page of the map is touched, so none counts in this process's memory);
        returns the bytes read, fewer than `dst` holds only when the file got shorter."""
        return os.preadv(self._fd, [dst], offset)

    def crc32(self, chunk: int = 1 << 20) -> int:
        """CRC32 of the mapped file's bytes, read with pread in chunks into one small buffer: like
        `read_into`, no page of the map is touched, so checking a shard does not make this process hold
        all of its pages (a window of shards, checked at once, counted in every worker's PSS)."""
        buf = bytearray(chunk)
        view = memoryview(buf)
        crc, offset = 0, 0
        while offset < len(self):
            n = os.preadv(self._fd, [view[:min(chunk, len(self) - offset)]], offset)
            if n == 0:
                break                               # the file got shorter: the CRC cannot match
            crc = zlib.crc32(view[:n], crc)
            offset += n
        return crc & 0xFFFFFFFF

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        super().close()

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1


def map_local_shard(path: str, size: int | None, crc32: int | None, label: str | None = None):
    """A read-only mmap of the shard at `path` (b"" when empty), verified as described above.

    Raises CorruptShardError for a size or CRC32 mismatch, FileNotFoundError if it is missing.
    """
    label = label or path
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if size is not None and st.st_size != size:
            raise CorruptShardError(f"{label}: {st.st_size} bytes, expected {size}")
        data = MappedShard(f, st) if st.st_size else b""
    if crc32 is not None:
        ident = file_identity(path, st, crc32)
        if ident not in VERIFIED:
            crc = data.crc32() if isinstance(data, MappedShard) else zlib.crc32(data) & 0xFFFFFFFF
            if crc != crc32:
                raise CorruptShardError(f"{label}: crc32 {crc:#010x}, expected {crc32:#010x}")
            VERIFIED.add(ident)
    return data
