"""Scanning existing WebDataset tars (plain or gzip) in one sequential pass.

`scan_tar(stream)` parses 512-byte tar headers itself (ustar names with
prefix, GNU long names, pax `path`/`size` records) and yields every regular
member with the offset of its header, of its data (in the uncompressed tar
stream) and its size; the caller reads or skips each member's data.
`split_key` applies the webdataset rule: consecutive members whose names
share the part before the first dot of the basename form one sample.

Hostile input: every header field is checked (octal digits, checksum, pax
records well formed, sizes not negative, extension headers at most
`MAX_EXTENSION_BYTES`), and anything malformed raises `TarFormatError`
instead of looping, allocating what a header declares, or leaking a
`ValueError`. Reads are chunked, so a member that declares 2**62 bytes costs
a sequential skip to the end of the stream, never that much memory. Names are
decoded as UTF-8 with `surrogateescape`: names that are not UTF-8 stay
distinct (see `is_utf8_name`). Links, devices and FIFOs carry no data (as in
`tarfile`); `scan_tar(..., specials=True)` yields them too (`TarEntry.kind`).

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
MAX_EXTENSION_BYTES = 1 << 20   # a pax or GNU long-name header's data; real ones are a few hundred bytes
_NO_DATA = frozenset(b"123456")    # hard link, symlink, char/block device, directory, FIFO: no data blocks
_EXTENSIONS = frozenset((b"L", b"K", b"x", b"g"))


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
        out = self._f.read(min(n, _CHUNK))
        if len(out) < n and out:
            parts = [out]
            got = len(out)
            while got < n:   # chunked: a huge n costs what the stream holds, never an n-byte allocation
                more = self._f.read(min(n - got, _CHUNK))
                if not more:
                    break
                parts.append(more)
                got += len(more)
            out = b"".join(parts)
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
    """A member: name, header offset (first of its extension headers), data offset, size.

    `kind` is "file" for regular members (the only kind yielded by default), "link" for hard and
    symbolic links and "special" for devices and FIFOs (those two carry no data).
    """

    name: str
    header: int
    data: int
    size: int
    kind: str = "file"


def is_utf8_name(name: str) -> bool:
    """False for a member name that was not valid UTF-8 in the tar (decoded with surrogateescape)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _octal(field: bytes, what: str = "numeric", offset: int = 0) -> int:
    if field and field[0] == 0x80:  # GNU base-256 (0xff would be negative)
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    if not text:
        return 0
    if text.strip(b"01234567"):
        raise TarFormatError(f"tar header at offset {offset}: {what} field is not octal")
    return int(text, 8)


def _name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _check_header(block: bytes, offset: int) -> None:
    stored = _octal(block[148:156], "checksum", offset)
    actual = sum(block[:148]) + 8 * 32 + sum(block[156:])
    if stored != actual:
        raise TarFormatError(f"bad tar header checksum at offset {offset}")


def _pax(data: bytes, offset: int) -> dict[str, str]:
    """Records "<length> <key>=<value>\\n"; anything else is a TarFormatError (never a loop or ValueError)."""
    out, pos = {}, 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos, pos + 24)
        digits = data[pos:space] if space > pos else b""
        if not digits.isdigit():
            raise TarFormatError(f"malformed pax record at offset {offset + pos}: no length")
        length = int(digits)
        end = pos + length
        if length <= space - pos + 1 or end > len(data) or data[end - 1:end] != b"\n":
            raise TarFormatError(f"malformed pax record at offset {offset + pos}: bad length {length}")
        key, eq, value = data[space + 1:end - 1].partition(b"=")
        if not eq or not key:
            raise TarFormatError(f"malformed pax record at offset {offset + pos}: no key=value")
        out[_name(key)] = _name(value)
        pos = end
    return out


def _pax_size(value: str, offset: int) -> int:
    if not value.isascii() or not value.isdigit():
        raise TarFormatError(f"pax size {value[:20]!r} of the member at offset {offset} is not a number")
    return int(value)


def scan_tar(stream: CountingReader, specials: bool = False) -> Iterator[tuple[TarEntry, CountingReader]]:
    """Yield (entry, stream) per regular member; the caller may read up to entry.size bytes of data.

    Whatever the caller leaves unread is skipped before the next header. With
    `specials`, links, devices and FIFOs are yielded too (size 0, kind "link" or
    "special"). A malformed header raises TarFormatError.
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
        size = _octal(block[124:136], "size", start)
        kind = block[156:157]
        padded = (size + BLOCK - 1) // BLOCK * BLOCK
        if kind in _EXTENSIONS:
            if size > MAX_EXTENSION_BYTES:
                raise TarFormatError(f"extension header at offset {start} declares {size} bytes")
            data = stream.read(size)
            if len(data) < size:
                raise TarFormatError(f"truncated extension header at offset {start}")
            stream.skip(padded - size)
            if kind == b"L":
                long_name = _name(data.split(b"\0", 1)[0])
            elif kind == b"x":
                pax = _pax(data, stream.pos - padded)
            if kind == b"g":
                first_header = None
            continue
        name = _name(block[0:100].split(b"\0", 1)[0])
        if block[257:262] == b"ustar":
            prefix = _name(block[345:500].split(b"\0", 1)[0])
            if prefix:
                name = f"{prefix}/{name}"
        name = pax.get("path", long_name or name)
        if "size" in pax:
            size = _pax_size(pax["size"], start)
        if kind and kind[0] in _NO_DATA:
            size = 0   # like tarfile: links, devices, directories and FIFOs have no data blocks
        padded = (size + BLOCK - 1) // BLOCK * BLOCK
        header, data_start = first_header, stream.pos
        long_name, pax, first_header = None, {}, None
        if kind in (b"0", b"\0", b"7"):
            entry = TarEntry(name=name, header=header, data=data_start, size=size)
        elif specials and kind in (b"1", b"2", b"3", b"4", b"6"):
            entry = TarEntry(name=name, header=header, data=data_start, size=0,
                             kind="link" if kind in (b"1", b"2") else "special")
        else:
            stream.skip(padded)
            continue
        yield entry, stream
        consumed = stream.pos - data_start
        if consumed > size:
            raise RuntimeError("caller read past the member data")
        stream.skip(padded - consumed)


def split_key(name: str) -> tuple[str, str]:
    """(key, extension): the webdataset rule, split at the first dot of the basename."""
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1:]
