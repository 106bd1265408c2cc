"""Image checks from bytes: header sizes for every format, truncation, bombs, re-encode."""
from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image

from vlmdata.errors import ImageProblem
from vlmdata.ingest import ImageOptions, check_image, header_size, prepare_image, sniff

FORMATS = [("JPEG", "jpg"), ("PNG", "png"), ("GIF", "gif"), ("WEBP", "webp"), ("BMP", "bmp"), ("TIFF", "tiff")]


def webp(size, chunk: str = "VP8 ", payload: int = 200) -> bytes:
    """A WebP container with a valid header for `chunk` and a dummy payload (only its header is read)."""
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


def _oriented_jpeg(w: int = 96, h: int = 48, orientation: int = 6) -> bytes:
    """Stored w x h: left half red, right half blue; EXIF says "rotate 90 CW to display"."""
    import numpy as np

    arr = np.zeros((h, w, 3), np.uint8)
    arr[:, : w // 2] = (220, 0, 0)
    arr[:, w // 2:] = (0, 0, 220)
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=95, exif=exif.tobytes())
    return buf.getvalue()


def test_exif_orientation_index_sizes_equal_decoded_sizes(tmp_path):
    """Index (w, h) are the displayed pixels (EXIF orientation applied), which is what every decoder returns."""
    import json

    import numpy as np

    from tests.helpers.shards import shard
    from vlmdata.decode import DynamicPolicy, PillowDecoder, TurboDecoder
    from vlmdata.formats import SampleIndex

    data = _oriented_jpeg()
    assert Image.open(io.BytesIO(data)).getexif()[0x0112] == 6
    assert check_image(data, 1 << 30)[1:] == (48, 96)
    (tmp_path / "a.jpg").write_bytes(data)
    conv = [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "red above blue"}]
    (tmp_path / "d.jsonl").write_text(json.dumps({"id": "r", "image": "a.jpg", "conversations": conv}) + "\n")
    shard(tmp_path / "d.jsonl", tmp_path / "out")
    idx = SampleIndex.load(str(next((tmp_path / "out").glob("*.index.npz"))))
    sizes = [(int(idx.width[0]), int(idx.height[0]))]
    assert sizes == [(48, 96)]

    policy = DynamicPolicy(patch=8, merge=1, min_pixels=16 * 16, max_pixels=96 * 48)
    from vlmdata.decode.dali import DaliCpuDecoder

    tw, th = policy.target_size(48, 96)
    for dec in (PillowDecoder(), TurboDecoder(), DaliCpuDecoder()):
        (out,) = dec.decode([data], sizes, policy)
        assert out.shape == (th, tw, 3), dec.name
        # turned 90 degrees clockwise, as displayed: the stored left half (red) is now on top
        top, bottom = out[: th // 2 - 2].mean((0, 1)), out[th // 2 + 2:].mean((0, 1))
        assert top[0] > 180 and top[2] < 40 and bottom[2] > 180 and bottom[0] < 40, (dec.name, top, bottom)
    assert np.asarray(Image.open(io.BytesIO(data))).shape == (48, 96, 3)   # stored pixels, for the record


def test_reencode_stores_displayed_pixels_without_an_orientation_tag():
    data = _oriented_jpeg(400, 200)
    assert check_image(data, 1 << 30)[1:] == (200, 400)
    im = prepare_image(data, ImageOptions(resize_max_side=100))
    assert (im.width, im.height) == (50, 100)
    out = Image.open(io.BytesIO(im.data))
    assert out.size == (50, 100) and dict(out.getexif()) == {}
    arr = np.asarray(out.convert("RGB")).astype(int)
    assert arr[:40].mean((0, 1))[0] > 180 and arr[60:].mean((0, 1))[2] > 180   # red on top, blue below


def test_decode_failures_never_quote_the_files_bytes(monkeypatch):
    """A decoder message that quotes file bytes (Pillow: "broken PNG file (chunk b'...')") is scrubbed."""
    import vlmdata.ingest.images as images_mod

    def broken(*args, **kwargs):
        raise SyntaxError("broken PNG file (chunk b'root:*:0')")

    from PIL import ImageFile

    monkeypatch.setattr(ImageFile.ImageFile, "load", broken)
    with pytest.raises(ImageProblem) as e:
        images_mod.verify_decodes(encode("PNG"), 10**8)
    assert e.value.reason == "undecodable_image" and "root" not in str(e.value) and "broken PNG" in str(e.value)
