"""Writing tar shards with known member offsets, and reading members back by offset."""
from __future__ import annotations

import tarfile
import time
from dataclasses import dataclass


@dataclass
class MemberLocation:
    """Where a member landed: header offset, data offset and data size."""

    header: int
    data: int
    size: int


_MODE_IDS = b"0000444\0" + b"0000000\0" + b"0000000\0"          # mode, uid, gid
_TAIL = b"0" + b"\0" * 100 + b"ustar\x0000" + b"\0" * (64 + 16 + 167)  # type .. end of the 512-byte block


class TarShardWriter:
    """Append members to an uncompressed tar stream and report their offsets.

    Members are regular files with fixed metadata (mode 0444, mtime of the
    writer's creation, uid/gid 0) so that the same input gives the same bytes.
    Output is byte-identical to `tarfile.open(mode="w|", format=USTAR_FORMAT)`
    (tests/formats/test_tar_writer.py checks it) but headers are built directly and
    each member's data is written in one call, without tarfile's per-call
    TarInfo work and 10 KiB re-buffering of every member (several times faster).
    """

    def __init__(self, fileobj, mtime: float | None = None):
        self._f = fileobj
        self._mtime = int(mtime if mtime is not None else time.time())
        self._offset = 0
        self._mtime_field = b"%011o\0" % self._mtime
        self._fixed_sum = sum(_MODE_IDS) + sum(self._mtime_field) + sum(_TAIL) + 8 * 32  # chksum field as spaces

    @property
    def offset(self) -> int:
        return self._offset

    def _header(self, name: str, size: int) -> bytes:
        raw = name.encode("utf-8", "surrogateescape")
        if len(raw) > 100 or size >= 8 ** 11:  # long names / huge members: tarfile's general path
            info = tarfile.TarInfo(name)
            info.size = size
            info.mtime = self._mtime
            info.mode = 0o444
            info.uname = info.gname = ""
            return info.tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape")
        # the same bytes tarfile writes for this fixed metadata, built directly (it is the hot path)
        size_field = b"%011o\0" % size
        chksum = self._fixed_sum + sum(raw) + sum(size_field)
        return raw.ljust(100, b"\0") + _MODE_IDS + size_field + self._mtime_field + b"%06o\0 " % chksum + _TAIL

    def add(self, name: str, data: bytes) -> MemberLocation:
        header = self._header(name, len(data))
        start = self._offset
        self._f.write(header)
        self._f.write(data)
        pad = _padded(len(data)) - len(data)
        if pad:
            self._f.write(tarfile.NUL * pad)
        self._offset += len(header) + len(data) + pad
        return MemberLocation(header=start, data=start + len(header), size=len(data))

    def close(self) -> None:
        """End-of-archive blocks, padded to a whole tar record (as tarfile does)."""
        end = self._offset + 2 * tarfile.BLOCKSIZE
        end += -end % tarfile.RECORDSIZE
        self._f.write(tarfile.NUL * (end - self._offset))
        self._offset = end


def _padded(n: int) -> int:
    return (n + 511) // 512 * 512


def member_bytes(buf, offset: int, size: int) -> memoryview:
    """A zero-copy view of a member's data inside a whole-shard buffer."""
    if offset < 0 or offset + size > len(buf):
        raise ValueError(f"member at {offset}+{size} lies outside a shard of {len(buf)} bytes (truncated shard?)")
    return memoryview(buf)[offset:offset + size]
