"""Scanning existing WebDataset tars (plain or gzip) in one sequential pass.

`scan_tar(stream)` parses 512-byte tar headers itself (ustar names with
prefix, GNU long names, pax `path`/`size` records) and yields every regular
member with the offset of its header, of its data (in the uncompressed tar
stream) and its size; the caller reads or skips each member's data.
`group_samples` applies the webdataset rule: consecutive members whose names
share the part before the first dot of the basename form one sample.

Why one sequential pass instead of seeking over member data: the manifest
records each shard's CRC32 (the loader verifies what it fetches), and that
needs every byte anyway; a sequential read is the fastest way to read them,
on disks and object stores alike, and it is the only way through gzip.
"""
from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from vlmdata.errors import TarFormatError

BLOCK = 512
_CHUNK = 1 << 20


class CountingReader:
    """Sequential reader over a binary file: exact reads, skips, position and CRC32 of what passed."""

    def __init__(self, f, crc: bool = True):
        self._f = f
        self.pos = 0
        self.crc = 0
        self._do_crc = crc

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            parts = []
            while True:
                chunk = self.read(_CHUNK)
                if not chunk:
                    return b"".join(parts)
                parts.append(chunk)
        out = self._f.read(n)
        while len(out) < n:
            more = self._f.read(n - len(out))
            if not more:
                break
            out += more
        self.pos += len(out)
        if self._do_crc:
            self.crc = zlib.crc32(out, self.crc)
        return out

    def skip(self, n: int) -> None:
        while n > 0:
            chunk = self.read(min(n, _CHUNK))
            if not chunk:
                raise TarFormatError(f"unexpected end of data at {self.pos} (truncated shard?)")
            n -= len(chunk)

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass


@dataclass
class TarEntry:
    """A regular member: name, header offset (first of its extension headers), data offset, size."""

    name: str
    header: int
    data: int
    size: int


def _octal(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256
        value = int.from_bytes(field[1:], "big")
        return value
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _check_header(block: bytes, offset: int) -> None:
    stored = _octal(block[148:156])
    actual = sum(block[:148]) + 8 * 32 + sum(block[156:])
    if stored != actual:
        raise TarFormatError(f"bad tar header checksum at offset {offset}")


def _pax(data: bytes) -> dict[str, str]:
    out, pos = {}, 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        pos += length
    return out


def scan_tar(stream: CountingReader) -> Iterator[tuple[TarEntry, CountingReader]]:
    """Yield (entry, stream) per regular member; the caller may read up to entry.size bytes of data.

    Whatever the caller leaves unread is skipped before the next header.
    """
    long_name: str | None = None
    pax: dict[str, str] = {}
    first_header: int | None = None
    while True:
        start = stream.pos
        block = stream.read(BLOCK)
        if len(block) < BLOCK:
            if block or first_header is not None:
                raise TarFormatError(f"truncated tar header at offset {start}")
            return  # no end-of-archive blocks: accept a plain EOF at a member boundary
        if block == b"\0" * BLOCK:
            return
        _check_header(block, start)
        if first_header is None:
            first_header = start
        size = _octal(block[124:136])
        kind = block[156:157]
        padded = (size + BLOCK - 1) // BLOCK * BLOCK
        if kind in (b"L", b"x", b"g"):
            data = stream.read(size)
            stream.skip(padded - size)
            if kind == b"L":
                long_name = data.split(b"\0", 1)[0].decode("utf-8", "replace")
            elif kind == b"x":
                pax = _pax(data)
            if kind == b"g":
                first_header = None
            continue
        name = block[0:100].split(b"\0", 1)[0].decode("utf-8", "replace")
        if block[257:262] == b"ustar":
            prefix = block[345:500].split(b"\0", 1)[0].decode("utf-8", "replace")
            if prefix:
                name = f"{prefix}/{name}"
        name = pax.get("path", long_name or name)
        size = int(pax.get("size", size))
        padded = (size + BLOCK - 1) // BLOCK * BLOCK
        header, data_start = first_header, stream.pos
        long_name, pax, first_header = None, {}, None
        if kind in (b"0", b"\0", b"7"):
            entry = TarEntry(name=name, header=header, data=data_start, size=size)
            yield entry, stream
            consumed = stream.pos - data_start
            if consumed > size:
                raise RuntimeError("caller read past the member data")
            stream.skip(padded - consumed)
        else:
            stream.skip(padded)


def split_key(name: str) -> tuple[str, str]:
    """(key, extension): the webdataset rule, split at the first dot of the basename."""
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1:]
