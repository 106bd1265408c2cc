"""Does this index describe this shard? Checks that keep a key from ever being read with another sample's bytes.

Three checks, from the cheapest up:

- `check_index_file(index, info)`, once per index file: the index names the shard it describes (size and
  CRC32, recorded when it was written; indices from before that keep loading without it), and that
  must be the shard the manifest lists; the row count and the row layout must agree. Another shard's
  index, or a stale one, is refused as a whole (`BadIndexError`).
- `MemberCheck`, before each sample of a tar shard is read: every member the row points at is preceded
  by its 512-byte tar header, which holds the member's name and size. The name must be the row's key
  followed by a dot (for vlmdata's own layout exactly `<key>.tok.npy`, and `<key>.<j>.<ext>` for image
  j) and the size the recorded one. Rows swapped, or offsets that point at another sample, fail
  (`IndexMismatchError`): that sample is skipped and counted, never delivered.
- `memmap_bad_rows`, once per memmap shard (vectorised): every row's token range, meta range and image
  rows lie inside the shard's arrays (a negative or too large image row would silently read another
  image). Inside the arrays, each image row carries its owner's `owner_tag` (formats/memmap.py), the
  memmap counterpart of a tar member's name, checked as each sample is read.

Names longer than the header's 100-byte name field, as other tools write them (a ustar prefix, a GNU
long name or a pax `path` record before the header), are read the way `tar_scan` reads them; the
comparison is made on the name as `vlmdata index` recorded it (UTF-8, undecodable bytes replaced).
The common case costs two slices and two comparisons per member.
"""
from __future__ import annotations

import hashlib

import numpy as np

from vlmdata.errors import BadIndexError, IndexMismatchError

__all__ = ["MemberCheck", "check_index_file", "memmap_bad_rows", "owner_tag"]

BLOCK = 512
_LONG_NAME_TYPES = (b"L", b"x")            # GNU long name, pax extended header
_MAX_LOOKBACK = 64                         # blocks searched backwards for a long-name record


def check_index_file(index, info) -> None:
    """Raise BadIndexError unless `index` (a SampleIndex) describes the shard `info` (a ShardInfo) lists."""
    if index.shard_crc32 is not None and (index.shard_crc32 != info.crc32 or index.shard_bytes != info.bytes):
        raise BadIndexError(
            f"{info.index} describes a shard of {index.shard_bytes} bytes with CRC32 {index.shard_crc32:#010x}, "
            f"but {info.name} has {info.bytes} bytes with CRC32 {info.crc32:#010x}: it is another shard's index, "
            "or a stale one (re-create it with `vlmdata index` or `vlmdata shard`)")
    if len(index) != info.samples:
        raise BadIndexError(f"{info.index}: {len(index)} samples, the manifest says {info.samples}")
    try:
        index.validate()
    except ValueError as exc:
        raise BadIndexError(f"{info.index}: {exc}") from None


def _octal(field: bytes) -> int | None:
    """A tar numeric field (octal text); None for base-256 or garbage."""
    if field[:1] and field[0] & 0x80:
        return None
    text = field.split(b"\0", 1)[0].strip(b" ")
    try:
        return int(text or b"0", 8)
    except ValueError:
        return None


def _valid_header(head: bytes) -> bool:
    stored = _octal(head[148:156])
    return stored is not None and stored == sum(head[:148]) + 8 * 32 + sum(head[156:])


def _normal(name: bytes) -> bytes:
    """A name as `vlmdata index` records keys: decoded as UTF-8 with undecodable bytes replaced."""
    return name.decode("utf-8", "replace").encode("utf-8")


def _pax_records(data: bytes) -> dict[bytes, bytes]:
    out, pos = {}, 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError:
            break
        if length <= 0:
            break
        record = data[space + 1:pos + length].rstrip(b"\n")
        key, _, value = record.partition(b"=")
        out[key] = value
        pos += length
    return out


def _long_name(buf, header: int) -> tuple[bytes | None, int | None]:
    """(name, size) from a GNU long-name or pax record right before the header at `header`, if any."""
    for k in range(1, _MAX_LOOKBACK + 1):
        h = header - BLOCK * (k + 1)
        if h < 0:
            break
        head = bytes(buf[h:h + BLOCK])
        if head[156:157] not in _LONG_NAME_TYPES or not _valid_header(head):
            continue
        size = _octal(head[124:136])
        if size is None or (size + BLOCK - 1) // BLOCK != k:
            continue
        data = bytes(buf[h + BLOCK:h + BLOCK + size])
        if head[156:157] == b"L":
            return data.split(b"\0", 1)[0], None
        records = _pax_records(data)
        psize = records.get(b"size")
        return records.get(b"path"), (int(psize) if psize and psize.isdigit() else None)
    return None, None


class MemberCheck:
    """`check(buf, i)` raises IndexMismatchError unless row i of `index` points at sample i's own members.

    `own_layout`: the shard was written by vlmdata (text member `<key>.tok.npy`, images `<key>.<j>.<ext>`);
    otherwise (tars indexed in place) every member must be named `<key>.<something>`.
    """

    def __init__(self, index, own_layout: bool):
        self.own_layout = own_layout
        self.keys = index.key.tolist()
        self.tok = list(zip(index.tok_offset.tolist(), index.tok_size.tolist()))
        self.images = list(zip(index.img_offset.tolist(), index.img_size.tolist()))
        self.image_start = index.image_start.tolist()
        self.n_images = index.n_images.tolist()

    def __call__(self, buf, i: int) -> None:
        key = self.keys[i]
        off, size = self.tok[i]
        if self.own_layout:
            self._member(buf, off, size, key + b".tok.npy", True, i)
        else:
            self._member(buf, off, size, key + b".", False, i)
        start = self.image_start[i]
        for j in range(self.n_images[i]):
            off, size = self.images[start + j]
            want = key + (b".%d." % j if self.own_layout else b".")
            self._member(buf, off, size, want, False, i)

    def _member(self, buf, off: int, size: int, want: bytes, exact: bool, i: int) -> None:
        h = off - BLOCK
        if h < 0 or size < 0 or off + size > len(buf):
            raise IndexMismatchError(f"index row {i} ({self.keys[i]!r}): member at {off}+{size} lies outside "
                                     f"the shard of {len(buf)} bytes")
        head = bytes(buf[h:h + BLOCK])
        name = head[:100]
        n = len(want)
        if name[:n] == want and (not exact or n == 100 or name[n] == 0) and _octal(head[124:136]) == size:
            return  # the common case: a plain ustar header with this name and size
        problem = self._slow_check(buf, h, head, size, want, exact)
        if problem:
            raise IndexMismatchError(f"index row {i} ({self.keys[i].decode('utf-8', 'replace')!r}) points at "
                                     f"{problem}: the index does not describe this shard")

    @staticmethod
    def _slow_check(buf, h: int, head: bytes, size: int, want: bytes, exact: bool) -> str | None:
        """Long or non-UTF-8 names, pax sizes; the reason for a mismatch, or None."""
        if not _valid_header(head):
            return "no tar member header"
        field = head[:100]
        nul = field.find(b"\0")
        name = field if nul < 0 else field[:nul]
        prefix = head[345:500].split(b"\0", 1)[0] if head[257:262] == b"ustar" else b""
        full = prefix + b"/" + name if prefix else name
        long_name, long_size = _long_name(buf, h)
        truncated = False
        if long_name is not None:
            full = long_name
        elif nul < 0 and not prefix:
            truncated = True  # a long name another tool wrote: the field holds its first 100 bytes
        got_size = long_size if long_size is not None else _octal(head[124:136])
        full, want = _normal(full), _normal(want)
        if truncated and len(full) < len(want):
            same = want.startswith(full)
        elif exact:
            same = full == want
        else:
            same = full.startswith(want)
        if not same:
            return f"member {full.decode('utf-8', 'replace')!r}"
        if got_size is not None and got_size != size:
            return f"member {full.decode('utf-8', 'replace')!r} of {got_size} bytes, not {size}"
        return None


def owner_tag(key: bytes, j: int) -> int:
    """The 64-bit tag of image j of the sample `key` (UTF-8): what a memmap image row says it is."""
    return int.from_bytes(hashlib.blake2b(key + b"\0" + str(j).encode(), digest_size=8).digest(), "little")


def memmap_bad_rows(index, n_images: int, n_tokens: int, meta_bytes: int) -> np.ndarray | None:
    """A bool mask of the rows whose tokens, meta or image rows lie outside a memmap shard's arrays
    (None when every row is inside). Raises BadIndexError for an index whose columns disagree."""
    n = len(index)
    if n == 0:
        return None
    if len(index.img_offset) != int(np.sum(index.n_images, dtype=np.int64)) or (index.n_images < 0).any():
        raise BadIndexError("index image rows do not match its n_images column")
    tok_o, tok_n = index.tok_offset, index.tok_size
    bad = (tok_o < 0) | (tok_n < 0) | (tok_o + tok_n > n_tokens)
    meta_o, meta_n = index.meta_offset, index.meta_size
    bad |= (meta_o >= 0) & ((meta_n < 0) | (meta_o + meta_n > meta_bytes))
    bad_images = (index.img_offset < 0) | (index.img_offset >= n_images)
    if bad_images.any():
        owner = np.repeat(np.arange(n), index.n_images.astype(np.int64))
        bad[owner[bad_images]] = True
    return bad if bad.any() else None
