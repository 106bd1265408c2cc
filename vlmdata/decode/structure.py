"""A structural check that proves the common JPEG and PNG without decoding them (`vlmdata shard --verify structure`).

`clean_structure(data)` returns (Pillow format, (width, height)) when the file's
structure is clean, and None for anything odd, which the caller then hands to the
real decode (`probe.probe_decode`). It never refuses a file by itself.

- JPEG: the marker segments are walked (SOI; APPn, COM, DQT, DHT, DRI lengths
  inside the file; exactly one baseline, extended or progressive SOF with 8-bit
  samples, 1, 3 or 4 components, sampling factors 1-4 in integral ratios;
  Huffman tables whose code counts fit the code space, DC symbols at most 15;
  every SOS naming frame components whose quantisation and Huffman tables are
  defined, at most 10 blocks per MCU: what libjpeg refuses as an error). The
  entropy-coded data after each SOS is checked with numpy: every 0xFF is
  followed by 0x00 (stuffing), by RST0-7 in order (only with a restart interval),
  or by the next marker. The walk must end at an EOI that is the last two bytes.
  The APP segments Pillow's header parser reads must be long enough for it
  (JFIF and Adobe 7 bytes, ICC 14); MPF and Photoshop segments, lossless,
  arithmetic and hierarchical frames, DNL, fill bytes, a missing EOI and data
  after it are all "odd".
- PNG: the chunk walk checks every chunk's length and CRC32, IHDR first with a
  valid depth/colour combination, PLTE before IDAT for palette images, at least
  one IDAT and IEND as the last 12 bytes. Chunks Pillow inflates when opening
  (iCCP, zTXt, iTXt), unknown critical chunks and chunk names that are not
  four letters (Pillow refuses those) are "odd".

What this proves: a JPEG's or PNG's container is intact (no truncation, no
garbage behind a valid header: random bytes hold an 0xFF followed by an invalid
byte, or fail a CRC). What it does not prove: that
the Huffman codes of a JPEG scan or the zlib stream of a PNG decode. A file with
a clean structure and a wrong stream is kept and counted as `corrupt_image` at
load time (Pillow decodes most such JPEGs to noise anyway).
"""
from __future__ import annotations

import functools
import struct
import threading
import zlib

import numpy as np

__all__ = ["clean_structure", "jpeg_structure", "png_structure"]

_JPEG_FRAMES = {0xC0: False, 0xC1: False, 0xC2: True}    # SOF marker -> progressive
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_DEPTHS = {0: {1, 2, 4, 8, 16}, 2: {8, 16}, 3: {1, 2, 4, 8}, 4: {8, 16}, 6: {8, 16}}   # colour type -> depths
_PNG_KNOWN_CRITICAL = {b"IHDR", b"PLTE", b"IDAT", b"IEND"}
_PNG_INFLATED_AT_OPEN = {b"iCCP", b"zTXt", b"iTXt"}


def clean_structure(data) -> tuple[str, tuple[int, int]] | None:
    """(Pillow format, stored (w, h)) when `data` is a structurally clean JPEG or PNG; else None."""
    head = bytes(data[:8])
    if head[:3] == b"\xff\xd8\xff":
        size = jpeg_structure(data)
        return None if size is None else ("JPEG", size)
    if head == _PNG_SIGNATURE:
        size = png_structure(data)
        return None if size is None else ("PNG", size)
    return None


class _Odd(Exception):
    """The structure is not the clean common case: the real decode decides."""


class _JpegWalk:
    """One walk over a JPEG's segments; `run()` returns (w, h) or raises _Odd."""

    def __init__(self, data) -> None:
        self.data = data
        self.n = len(data)
        self.qtables: set[int] = set()
        self.dc: set[int] = set()
        self.ac: set[int] = set()
        self.restart = 0
        self.frame: dict[int, int] | None = None      # component id -> quantisation table
        self.blocks: dict[int, tuple[int, int]] = {}  # component id -> sampling factors (h, v)
        self.progressive = False
        self.size = (0, 0)
        self.base = 0                                 # where the first scan's entropy-coded data starts
        self.markers: np.ndarray | None = None        # from there: True at each 0xFF not followed by 0x00

    def run(self) -> tuple[int, int]:
        data, n = self.data, self.n
        pos, scans = 2, 0
        while True:
            if pos + 2 > n or data[pos] != 0xFF:
                raise _Odd
            marker = data[pos + 1]
            if marker == 0xD9:
                if not scans or pos + 2 != n:
                    raise _Odd
                return self.size
            if pos + 4 > n:
                raise _Odd
            end = pos + 2 + ((data[pos + 2] << 8) | data[pos + 3])
            if end < pos + 4 or end > n:
                raise _Odd
            if marker >= 0xE0:           # APPn, COM, JPGn: only an APP segment's first bytes matter
                if marker > 0xEF and marker != 0xFE:
                    raise _Odd
                _check_app(marker, data[pos + 4:min(end, pos + 18)], end - pos - 4)
            elif marker == 0xDA:
                self._scan_header(data[pos + 4:end])
                end = self._scan_end(end)
                scans += 1
            else:
                self._segment(marker, data[pos + 4:end])
            pos = end

    def _segment(self, marker: int, s: bytes) -> None:
        if marker == 0xDB:
            self._dqt(s)
        elif marker == 0xC4:
            self._dht(s)
        elif marker == 0xDD:
            if len(s) != 2:
                raise _Odd
            self.restart = (s[0] << 8) | s[1]
        elif marker in _JPEG_FRAMES:
            self._frame(marker, s)
        else:                     # DNL, DAC, the other SOFs, ... are odd
            raise _Odd

    def _dqt(self, s: bytes) -> None:
        tables = _dqt_tables(s)
        if tables is None:
            raise _Odd
        self.qtables |= tables

    def _dht(self, s: bytes) -> None:
        tables = _dht_tables(s)
        if tables is None:
            raise _Odd
        self.dc |= tables[0]
        self.ac |= tables[1]

    def _frame(self, marker: int, s: bytes) -> None:
        if self.frame is not None or len(s) < 6:
            raise _Odd
        bits, height, width, count = s[0], (s[1] << 8) | s[2], (s[3] << 8) | s[4], s[5]
        if bits != 8 or not height or not width or count not in (1, 3, 4) or len(s) != 6 + 3 * count:
            raise _Odd
        frame, blocks = {}, {}
        for i in range(6, len(s), 3):
            h, v = s[i + 1] >> 4, s[i + 1] & 15
            if not (1 <= h <= 4 and 1 <= v <= 4) or s[i + 2] > 3 or s[i] in frame:
                raise _Odd
            frame[s[i]], blocks[s[i]] = s[i + 2], (h, v)
        max_h, max_v = max(h for h, _ in blocks.values()), max(v for _, v in blocks.values())
        if any(max_h % h or max_v % v for h, v in blocks.values()):
            raise _Odd                           # fractional sampling: libjpeg does not implement it
        self.frame, self.blocks = frame, blocks
        self.progressive, self.size = _JPEG_FRAMES[marker], (width, height)

    def _scan_header(self, s: bytes) -> None:
        if self.frame is None or not s or not 1 <= s[0] <= 4 or len(s) != 4 + 2 * s[0]:
            raise _Odd
        count = s[0]
        ss, se, ah, al = s[-3], s[-2], s[-1] >> 4, s[-1] & 15
        if self.progressive:
            if ss > se or se > 63 or (ss == 0) != (se == 0) or (ss > 0 and count != 1) or ah > 13 or al > 13:
                raise _Odd
            needs_dc, needs_ac = ss == 0 and ah == 0, ss > 0
        else:
            if (ss, se, ah, al) != (0, 63, 0, 0):
                raise _Odd
            needs_dc = needs_ac = True
        mcu_blocks = 0
        for i in range(1, 1 + 2 * count, 2):
            component, dc, ac = s[i], s[i + 1] >> 4, s[i + 1] & 15
            if component not in self.frame or self.frame[component] not in self.qtables:
                raise _Odd
            if (needs_dc and dc not in self.dc) or (needs_ac and ac not in self.ac):
                raise _Odd
            mcu_blocks += self.blocks[component][0] * self.blocks[component][1]
        if count > 1 and mcu_blocks > 10:
            raise _Odd                           # more blocks per MCU than libjpeg allows

    def _scan_end(self, start: int) -> int:
        """Where the entropy-coded data starting at `start` ends (the next marker); _Odd on bad stuffing.

        A marker is an 0xFF not followed by 0x00; inside a scan only RST0-7, in order and only with
        a restart interval, may come before the marker that ends it.
        """
        if self.markers is None:
            self.base, self.markers = start, _marker_mask(self.data, start)
        mask, i, expected = self.markers, start - self.base, 0xD0
        while True:
            if i >= mask.size:
                raise _Odd                      # the file ends inside the scan
            j = i + int(mask[i:].argmax())      # the first marker at or after i (argmax stops at it)
            if not mask[j]:
                raise _Odd                      # no marker ends the scan: no EOI
            code = self.data[self.base + j + 1]
            if not 0xD0 <= code <= 0xD7:
                return self.base + j
            if not self.restart or code != expected:
                raise _Odd
            expected = 0xD0 + (expected - 0xCF) % 8
            i = j + 1


class _Scratch(threading.local):
    """Two boolean work arrays per thread, reused from file to file (a fresh array per file costs page faults)."""

    def __init__(self) -> None:
        self.arrays = (np.empty(0, np.bool_), np.empty(0, np.bool_))

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if self.arrays[0].size < n:
            self.arrays = (np.empty(max(n, 1 << 20), np.bool_), np.empty(max(n, 1 << 20), np.bool_))
        return self.arrays[0][:n], self.arrays[1][:n]


_SCRATCH = _Scratch()


def _marker_mask(data, start: int) -> np.ndarray:
    """mask[i] is True where data[start + i] == 0xFF and the next byte is not 0x00 (a marker, not stuffing).

    The mask is a view of this thread's scratch array: valid until its next call.
    """
    arr = np.frombuffer(data, np.uint8)
    n = max(0, len(arr) - 1 - start)
    is_ff, follows = _SCRATCH.get(n)
    np.equal(arr[start:len(arr) - 1], 0xFF, out=is_ff)
    np.not_equal(arr[start + 1:], 0, out=follows)
    return np.logical_and(is_ff, follows, out=is_ff)


@functools.lru_cache(maxsize=256)   # files from one encoder share their tables: each is parsed once
def _dqt_tables(s: bytes) -> frozenset[int] | None:
    """The quantisation table ids a DQT segment defines, or None if it is malformed."""
    i, tables = 0, set()
    while i < len(s):
        precision, table = s[i] >> 4, s[i] & 15
        if precision > 1 or table > 3:
            return None
        i += 1 + 64 * (precision + 1)
        tables.add(table)
    return frozenset(tables) if i == len(s) else None


@functools.lru_cache(maxsize=256)
def _dht_tables(s: bytes) -> tuple[frozenset[int], frozenset[int]] | None:
    """(DC, AC) Huffman table ids a DHT segment defines, or None if one is malformed or libjpeg refuses it."""
    i, tables = 0, (set(), set())
    while i < len(s):
        if i + 17 > len(s):
            return None
        cls, table, counts = s[i] >> 4, s[i] & 15, s[i + 1:i + 17]
        count = sum(counts)
        if cls > 1 or table > 3 or count > 256 or not _canonical(counts):
            return None
        if not cls and max(s[i + 17:i + 17 + count], default=0) > 15:
            return None                          # a DC symbol is a bit count, at most 15 (libjpeg refuses more)
        tables[cls].add(table)
        i += 17 + count
    return (frozenset(tables[0]), frozenset(tables[1])) if i == len(s) else None


def _canonical(counts: bytes) -> bool:
    """Whether Huffman code counts per length 1-16 fit the code space as libjpeg requires (no all-ones code)."""
    code = 0
    for length, n in enumerate(counts, 1):
        code += n
        if code >= 1 << length:
            return False
        code <<= 1
    return True


def _check_app(marker: int, s: bytes, length: int) -> None:
    """_Odd unless Pillow's header parser reads this APP segment (`s`: its first bytes) without failing."""
    if marker == 0xE0 and s.startswith(b"JFIF") and length < 7:
        raise _Odd
    if marker == 0xEE and s.startswith(b"Adobe") and length < 7:
        raise _Odd
    if marker == 0xE2 and (s.startswith(b"MPF\0") or (s.startswith(b"ICC_PROFILE\0") and length < 14)):
        raise _Odd
    if marker == 0xED and s.startswith(b"Photoshop 3.0\0"):
        raise _Odd


def jpeg_structure(data) -> tuple[int, int] | None:
    """(width, height) when the JPEG's segments and entropy-coded stuffing are clean (module docstring); else None."""
    if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    try:
        return _JpegWalk(bytes(data)).run()
    except _Odd:
        return None


def png_structure(data) -> tuple[int, int] | None:
    """(width, height) when every chunk of the PNG is whole with a good CRC32 (module docstring); else None."""
    view = memoryview(data)
    n, pos, size, seen = len(view), 8, None, set()
    while pos + 12 <= n:
        length, kind = struct.unpack(">I4s", view[pos:pos + 8])
        end = pos + 12 + length
        if end > n or zlib.crc32(view[pos + 4:end - 4]) != int.from_bytes(view[end - 4:end], "big"):
            return None
        if size is None:
            size = _ihdr(kind, view[pos + 8:end - 4])
            if size is None:
                return None
            color = view[pos + 17]
        elif kind in _PNG_INFLATED_AT_OPEN or not kind.isalpha() or (kind[:1].isupper()
                                                                     and kind not in _PNG_KNOWN_CRITICAL):
            return None
        elif kind == b"IEND":
            return size if end == n and b"IDAT" in seen else None
        elif kind == b"IDAT" and color == 3 and b"PLTE" not in seen:
            return None
        seen.add(kind)
        pos = end
    return None


def _ihdr(kind: bytes, body) -> tuple[int, int] | None:
    if kind != b"IHDR" or len(body) != 13:
        return None
    width, height, depth, color, compression, filtering, interlace = struct.unpack(">IIBBBBB", body)
    if not width or not height or depth not in _PNG_DEPTHS.get(color, ()) or compression or filtering:
        return None
    return (width, height) if interlace in (0, 1) else None
