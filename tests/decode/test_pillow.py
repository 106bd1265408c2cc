"""PillowDecoder: draft-mode decode to the policy's size, uint8 HWC, bad images -> None, counted."""
import io

import numpy as np
import pytest
from PIL import Image

from vlmdata.decode import DynamicPolicy, FixedPolicy, PillowDecoder


def encode(arr, fmt="JPEG", mode=None):
    img = Image.fromarray(arr)
    if mode:
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def gradient(w, h):
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // w, y * 255 // h, np.full_like(x, 128)], -1).astype(np.uint8)


def test_fixed_size_rgb_uint8_and_close_to_reference():
    arr = gradient(1200, 900)
    dec = PillowDecoder()
    [out] = dec.decode([encode(arr)], [(1200, 900)], FixedPolicy(336, 14))
    assert out.shape == (336, 336, 3) and out.dtype == np.uint8
    ref = np.asarray(Image.fromarray(arr).resize((336, 336), Image.Resampling.BICUBIC))
    assert np.abs(out.astype(int) - ref.astype(int)).mean() < 4


def test_draft_mode_decodes_downscaled():
    data = encode(gradient(1344, 1344))
    img = Image.open(io.BytesIO(data))
    img.draft("RGB", (336, 336))
    assert img.size == (336, 336)                             # libjpeg scaled by 1/4 before the resize
    dec = PillowDecoder()
    assert dec.decode_one(data, 336, 336).shape == (336, 336, 3)


def test_dynamic_policy_aspect_and_grayscale_png():
    pol = DynamicPolicy(patch=14, merge=2, min_pixels=56 * 56, max_pixels=448 * 448)
    gray = encode(gradient(900, 300), fmt="PNG", mode="L")
    [out] = PillowDecoder().decode([gray], [(900, 300)], pol)
    w, h = pol.target_size(900, 300)
    assert out.shape == (h, w, 3) and w > h


@pytest.mark.parametrize("data", [b"", b"<html>not an image</html>" * 10, None])
def test_corrupt_images_are_none_and_counted(data):
    if data is None:                                          # truncated JPEG
        data = encode(gradient(400, 300))[:500]
    dec = PillowDecoder()
    good = encode(gradient(100, 100))
    out = dec.decode([good, data], [(100, 100), (400, 300)], FixedPolicy(56, 14))
    assert out[0].shape == (56, 56, 3) and out[1] is None
    assert dec.pop_errors() == {"corrupt_image": 1}
    assert dec.pop_errors() == {}


def test_decompression_bomb_rejected_from_header():
    big = encode(np.zeros((2000, 2000, 3), np.uint8))
    dec = PillowDecoder(max_pixels=1_000_000)
    assert dec.decode_one(big, 56, 56) is None
    assert dec.pop_errors() == {"image_too_large": 1}


def test_bad_resample_name():
    with pytest.raises(ValueError, match="resample"):
        PillowDecoder(resample="nearest-ish")
