"""Image checks from bytes: header sizes for every format, truncation, bombs, re-encode."""
from __future__ import annotations

import io
import struct

import pytest
from PIL import Image

from vlmdata.ingest.images import ImageOptions, ImageProblem, check_image, header_size, prepare_image, sniff

FORMATS = [("JPEG", "jpg"), ("PNG", "png"), ("GIF", "gif"), ("WEBP", "webp"), ("BMP", "bmp"), ("TIFF", "tiff")]


def webp(size, chunk: str = "VP8 ", payload: int = 200) -> bytes:
    """A WebP container with a valid header for `chunk` (this Pillow build cannot write WebP)."""
    w, h = size
    if chunk == "VP8 ":
        body = b"\x10\x02\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", w, h)
    elif chunk == "VP8L":
        body = b"\x2f" + ((w - 1) | ((h - 1) << 14)).to_bytes(4, "little")
    else:
        body = b"\x00" * 4 + (w - 1).to_bytes(3, "little") + (h - 1).to_bytes(3, "little")
    body += b"\x00" * payload
    data = chunk.encode() + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", 4 + len(data)) + b"WEBP" + data


def encode(fmt: str, size=(37, 23), **kw) -> bytes:
    if fmt == "WEBP":
        return webp(size, "VP8L" if kw.get("lossless") else "VP8 ")
    buf = io.BytesIO()
    Image.new("RGB", size, (10, 200, 30)).save(buf, format=fmt, **kw)
    return buf.getvalue()


@pytest.mark.parametrize("fmt, kind", FORMATS)
def test_header_size_matches_pillow(fmt, kind):
    data = encode(fmt)
    assert sniff(data) == kind
    assert header_size(kind, data) == (37, 23)
    assert check_image(data, 10**8) == (kind, 37, 23)


def test_webp_lossless_and_progressive_jpeg_headers():
    assert header_size("webp", encode("WEBP", (301, 17), lossless=True)) == (301, 17)
    assert header_size("webp", webp((4000, 3000), "VP8X")) == (4000, 3000)
    assert header_size("jpg", encode("JPEG", (640, 480), progressive=True)) == (640, 480)


@pytest.mark.parametrize("fmt, cut", [("JPEG", 0.5), ("PNG", 0.9), ("GIF", 0.9), ("WEBP", 0.9), ("BMP", 0.9)])
def test_truncated_images_are_caught(fmt, cut):
    data = encode(fmt, (120, 80))
    with pytest.raises(ImageProblem) as e:
        check_image(data[: int(len(data) * cut)], 10**8)
    assert e.value.reason in ("truncated_image", "bad_image_header")


def test_other_problems():
    for data, reason in [(b"", "empty_file"), (b"<html>" * 10, "not_an_image"),
                         (encode("PNG", (300, 300)), "decompression_bomb"),
                         (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x00" * 40, "bad_image_header")]:
        with pytest.raises(ImageProblem) as e:
            check_image(data, 200 * 200)
        assert e.value.reason == reason


def test_prepare_keeps_or_reencodes():
    small = encode("JPEG", (100, 50))
    kept = prepare_image(small, ImageOptions(resize_max_side=200))
    assert kept.data is small and (kept.width, kept.height) == (100, 50)
    big = encode("PNG", (400, 100))
    out = prepare_image(big, ImageOptions(resize_max_side=200))
    assert out.ext == "jpg" and (out.width, out.height) == (200, 50) == Image.open(io.BytesIO(out.data)).size
    q = prepare_image(small, ImageOptions(quality=30))
    assert q.data != small and len(q.data) < len(small) and (q.width, q.height) == (100, 50)
