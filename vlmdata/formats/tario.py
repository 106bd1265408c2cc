"""Writing tar shards with known member offsets, and reading members back by offset."""
from __future__ import annotations

import io
import tarfile
import time
from dataclasses import dataclass


@dataclass
class MemberLocation:
    """Where a member landed: header offset, data offset and data size."""

    header: int
    data: int
    size: int


class TarShardWriter:
    """Append members to an uncompressed tar stream and report their offsets.

    Members are regular files with fixed metadata (mode 0444, mtime of the
    writer's creation, uid/gid 0) so that the same input gives the same bytes.
    """

    def __init__(self, fileobj, mtime: float | None = None):
        self._tar = tarfile.open(fileobj=fileobj, mode="w|", format=tarfile.USTAR_FORMAT)
        self._mtime = int(mtime if mtime is not None else time.time())

    @property
    def offset(self) -> int:
        return self._tar.offset

    def add(self, name: str, data: bytes) -> MemberLocation:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = self._mtime
        info.mode = 0o444
        info.uname = info.gname = ""
        header = self._tar.offset
        self._tar.addfile(info, io.BytesIO(data))
        data_offset = self._tar.offset - _padded(len(data))
        return MemberLocation(header=header, data=data_offset, size=len(data))

    def close(self) -> None:
        self._tar.close()


def _padded(n: int) -> int:
    return (n + 511) // 512 * 512


def member_bytes(buf, offset: int, size: int) -> memoryview:
    """A zero-copy view of a member's data inside a whole-shard buffer."""
    if offset < 0 or offset + size > len(buf):
        raise ValueError(f"member at {offset}+{size} lies outside a shard of {len(buf)} bytes (truncated shard?)")
    return memoryview(buf)[offset:offset + size]
