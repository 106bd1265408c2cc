"""What a keys.lmdb file must be before it is memory-mapped: LMDB's own meta pages, and all the bytes they name.

LMDB maps the file and follows page numbers into it; a page past the end of a
truncated file is a SIGBUS (the process dies, no exception), and a file that is
not LMDB at all is undefined. So before any map, `check_lmdb_file` reads the two
meta pages with plain reads: magic 0xBEEFC0DE, version 1, a power-of-two page
size, and a file at least as long as the newest meta page's last page (every
page LMDB will touch is below it: it refuses page numbers past that bound
itself). Anything else is a `BadKeyIndexError` naming the file and what to run.

The meta page layout (LMDB 0.9, 64-bit): a 16-byte page header, then magic (u32),
version (u32), fixed address (u64), map size (u64), the free-list and main
database records (48 bytes each; the page size is stored in the first's leading
u32), last page number (u64), transaction id (u64).
"""
from __future__ import annotations

import os
import struct

from vlmdata.errors import BadKeyIndexError

__all__ = ["check_lmdb_file", "map_size_for"]

MAGIC = 0xBEEFC0DE
_META = struct.Struct("<16xIIQQI92xQQ")    # header, magic, version, address, mapsize, psize, ..., last_pg, txnid
_MIN_PAGE, _MAX_PAGE = 512, 1 << 16


def _meta(head: bytes, offset: int) -> tuple[int, int, int] | None:
    """(page size, last page, txn id) of the meta page at `offset`, or None if it is not one."""
    if len(head) < offset + _META.size:
        return None
    magic, version, _, _, psize, last_pg, txnid = _META.unpack_from(head, offset)
    if magic != MAGIC or version != 1 or not _MIN_PAGE <= psize <= _MAX_PAGE or psize & (psize - 1):
        return None
    return psize, last_pg, txnid


def check_lmdb_file(path: str) -> int:
    """The bytes the file must hold (its newest meta page's last page, inclusive); BadKeyIndexError unless it is
    an LMDB file that holds them."""
    rebuild = "rebuild it with `vlmdata index --rebuild-keys DATASET`"
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(_MAX_PAGE + _META.size)
    first = _meta(head, 0)
    if first is None:
        raise BadKeyIndexError(f"{path} is not a vlmdata key index (not an LMDB file, or its header is damaged); "
                               f"{rebuild}")
    second = _meta(head, first[0])
    metas = [m for m in (first, second) if m is not None and m[0] == first[0]]
    psize, last_pg, _ = max(metas, key=lambda m: m[2])
    need = (last_pg + 1) * psize
    if size < need or size < 2 * psize:
        raise BadKeyIndexError(f"{path} is truncated ({size} bytes; its header says {need}): it was cut short "
                               f"while copied or written; {rebuild}")
    return need


def map_size_for(need: int) -> int:
    """A map size covering `need` bytes, in whole MiB (what a read-only environment maps: the file, no more)."""
    return max(1 << 20, -(-need // (1 << 20)) * (1 << 20))
