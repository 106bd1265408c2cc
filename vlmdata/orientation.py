"""EXIF orientation of encoded images: reading it from the bytes, applying it to pixels, displayed sizes.

Every decoder in vlmdata returns what stock Pillow's
`ImageOps.exif_transpose(img).convert("RGB")` shows: the image as displayed,
EXIF orientation applied. The shard-time sample index records displayed sizes
(width and height swapped for orientations 5-8), so index sizes keep equal
decoded sizes and the planner's token counts match the pixels.

Pillow itself applies a TIFF's orientation when it loads the pixels (and
reports the displayed size from the header), so code decoding through Pillow
applies orientation to every format but TIFF; decoders that do not use Pillow
never get TIFFs (DALI routes them to the CPU decoder).

`read_orientation(data)` reads the tag as Pillow's `Image.getexif()` does
(the first EXIF block, else XMP's `tiff:Orientation`), without decoding
pixels: JPEG, PNG, WebP and TIFF are parsed here (a few microseconds; PNG and
WebP chunks are walked, never inflated), other formats go through Pillow's
lazy `Image.open`. Values outside 1..8 mean "as stored", as in Pillow.

Datasets indexed before orientation was applied recorded the *stored* size of
images tagged 5-8. `effective_orientation` keeps those decoding as stored (the
old behaviour) whenever the target size agrees with the stored shape rather
than the displayed one, so no image is ever squashed into the wrong aspect.
"""
from __future__ import annotations

import io
import re
import struct

import numpy as np

__all__ = ["ORIENTATION_TAG", "TRANSPOSING", "apply_orientation", "displayed_size", "effective_orientation",
           "read_orientation"]

ORIENTATION_TAG = 0x0112
TRANSPOSING = frozenset((5, 6, 7, 8))       # orientations that swap width and height
_XMP = re.compile(rb'tiff:Orientation(="|>)([0-9])')
_JPEG_XMP = b"http://ns.adobe.com/xap/1.0/\x00"
_STANDALONE = frozenset((0x01, *range(0xD0, 0xD9)))


def displayed_size(width: int, height: int, orientation: int) -> tuple[int, int]:
    """(width, height) as displayed: swapped for orientations 5-8."""
    return (height, width) if orientation in TRANSPOSING else (width, height)


def effective_orientation(orientation: int, stored: tuple[int, int], target: tuple[int, int]) -> int:
    """The orientation to apply when decoding a stored (w, h) image to `target` (w, h); 1 = as stored.

    An index written before vlmdata applied orientation holds the stored shape of a 5-8
    image; a target with that shape (not the displayed one) means such an index, and the
    image is decoded as stored, as it always was.
    """
    if not 2 <= orientation <= 8:
        return 1
    if orientation not in TRANSPOSING or stored[0] == stored[1] or target[0] == target[1]:
        return orientation
    return orientation if (target[0] > target[1]) == (stored[1] > stored[0]) else 1


def apply_orientation(arr: np.ndarray, orientation: int) -> np.ndarray:
    """An (H, W, ...) array transformed like Pillow's `exif_transpose` for `orientation` (contiguous)."""
    if orientation == 2:
        out = arr[:, ::-1]
    elif orientation == 3:
        out = arr[::-1, ::-1]
    elif orientation == 4:
        out = arr[::-1]
    elif orientation == 5:
        out = arr.swapaxes(0, 1)
    elif orientation == 6:
        out = np.rot90(arr, 3)
    elif orientation == 7:
        out = arr[::-1, ::-1].swapaxes(0, 1)
    elif orientation == 8:
        out = np.rot90(arr, 1)
    else:
        return arr
    return np.ascontiguousarray(out)


def read_orientation(data) -> int:
    """The EXIF orientation of encoded image bytes, as Pillow's `getexif()` reads it (1 when absent)."""
    data = memoryview(data).cast("B")       # indexing gives Python ints for any buffer (numpy uint8 would wrap)
    head = bytes(data[:12])
    try:
        if head[:3] == b"\xff\xd8\xff":
            exif, xmp = _jpeg_blocks(data)
        elif head[:8] == b"\x89PNG\r\n\x1a\n":
            exif, xmp = _png_blocks(data)
        elif head[:4] == b"RIFF" and head[8:12] == b"WEBP":
            exif, xmp = _webp_blocks(data)
        elif head[:4] in (b"II*\x00", b"MM\x00*"):
            exif, xmp = bytes(data), None
        else:
            return _pillow_orientation(data)
    except (IndexError, struct.error, ValueError):
        return _pillow_orientation(data)
    value = _tiff_orientation(exif) if exif else None
    if value is None and xmp:
        m = _XMP.search(xmp)
        value = int(m.group(2)) if m else None
    return value if isinstance(value, int) else 1


def _jpeg_blocks(data) -> tuple[bytes | None, bytes | None]:
    """The first APP1 EXIF payload and the last APP1 XMP packet before the scan (as Pillow keeps them)."""
    exif = xmp = None
    n, pos = len(data), 2
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            break
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker in (0xD9, 0xDA):
            break
        length = (data[pos + 2] << 8) | data[pos + 3]
        if marker == 0xE1:
            seg = bytes(data[pos + 4:pos + 2 + length])
            if seg[:6] == b"Exif\x00\x00":
                exif = exif if exif is not None else seg[6:]
            elif seg[:29] == _JPEG_XMP:
                xmp = seg[29:]
        pos += 2 + length
    return exif, xmp


def _png_blocks(data) -> tuple[bytes | None, bytes | None]:
    """eXIf (or a "Raw profile type exif" text chunk) and the XMP iTXt chunk, wherever they are."""
    import zlib

    exif = xmp = None
    n, pos = len(data), 8
    while pos + 8 <= n:
        length, ctype = struct.unpack(">I4s", bytes(data[pos:pos + 8]))
        body = pos + 8
        if ctype == b"eXIf" and exif is None:
            exif = bytes(data[body:body + length])
            exif = exif[6:] if exif[:6] == b"Exif\x00\x00" else exif
        elif ctype in (b"tEXt", b"zTXt", b"iTXt"):
            chunk = bytes(data[body:body + length])
            key, _, rest = chunk.partition(b"\x00")
            if key == b"XML:com.adobe.xmp" and ctype == b"iTXt":
                xmp = rest[2:].split(b"\x00", 2)[-1] if rest[:1] == b"\x00" else None
            elif key == b"Raw profile type exif" and exif is None:
                text = zlib.decompress(rest[1:], bufsize=1 << 16) if ctype == b"zTXt" else rest
                hexdata = b"".join(text.split(b"\n")[3:])
                raw = bytes.fromhex(hexdata.decode("ascii"))
                exif = raw[6:] if raw[:6] == b"Exif\x00\x00" else raw
        elif ctype == b"IEND":
            break
        pos = body + length + 4
    return exif, xmp


def _webp_blocks(data) -> tuple[bytes | None, bytes | None]:
    exif = xmp = None
    n, pos = len(data), 12
    while pos + 8 <= n:
        ctype, length = struct.unpack("<4sI", bytes(data[pos:pos + 8]))
        body = bytes(data[pos + 8:pos + 8 + length]) if ctype in (b"EXIF", b"XMP ") else b""
        if ctype == b"EXIF" and exif is None:
            exif = body[6:] if body[:6] == b"Exif\x00\x00" else body
        elif ctype == b"XMP ":
            xmp = body
        pos += 8 + length + (length & 1)
    return exif, xmp


def _tiff_orientation(tiff: bytes) -> int | None:
    """Tag 0x0112 of the first IFD of a TIFF structure (EXIF payload or a TIFF file); None if absent."""
    if tiff[:4] == b"II*\x00":
        end = "<"
    elif tiff[:4] == b"MM\x00*":
        end = ">"
    else:
        return None
    (ifd,) = struct.unpack(end + "I", tiff[4:8])
    (count,) = struct.unpack(end + "H", tiff[ifd:ifd + 2])
    for i in range(min(count, 4096)):
        entry = tiff[ifd + 2 + 12 * i:ifd + 14 + 12 * i]
        tag, kind, num = struct.unpack(end + "HHI", entry[:8])
        if tag != ORIENTATION_TAG:
            continue
        if num != 1:
            return None
        if kind == 3:      # SHORT
            return struct.unpack(end + "H", entry[8:10])[0]
        if kind == 4:      # LONG
            return struct.unpack(end + "I", entry[8:12])[0]
        if kind == 1:      # BYTE
            return entry[8]
        return None
    return None


def _pillow_orientation(data) -> int:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(bytes(data))) as im:
            value = im.getexif().get(ORIENTATION_TAG, 1)
    except Exception:   # noqa: BLE001 - an unreadable header has no orientation; decoders report the image
        return 1
    return value if isinstance(value, int) else 1
