"""Tar streams written byte by byte, so tests can put exactly the malformed header fields they need."""
from __future__ import annotations

BLOCK = 512


def header(name: bytes, size: int = 0, kind: bytes = b"0", size_field: bytes | None = None,
           linkname: bytes = b"") -> bytes:
    """One ustar header block with a correct checksum; `size_field` overrides the 12-byte size field."""
    h = bytearray(BLOCK)
    h[0:len(name)] = name[:100]
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = size_field if size_field is not None else f"{size:011o}\0".encode()
    h[136:148] = b"00000000000\0"
    h[156:157] = kind
    h[157:157 + len(linkname)] = linkname
    h[257:263] = b"ustar\0"
    h[263:265] = b"00"
    h[148:156] = b" " * 8
    h[148:156] = f"{sum(h):06o}\0 ".encode()
    return bytes(h)


def member(name: bytes, data: bytes, kind: bytes = b"0") -> bytes:
    pad = -len(data) % BLOCK
    return header(name, len(data), kind) + data + b"\0" * pad


def pax(records: bytes) -> bytes:
    """A pax extended header ("x") holding `records` verbatim."""
    return member(b"././@PaxHeader", records, b"x")


def end() -> bytes:
    return b"\0" * (2 * BLOCK)
