"""TurboDecoder: TurboJPEG (simplejpeg) DCT-scaled decode, Pillow's pixels, Pillow fallback, bad images counted once."""
import io

import numpy as np
import pytest
from PIL import Image

from vlmdata.decode import DynamicPolicy, FixedPolicy, PillowDecoder, TurboDecoder, scale_for


def scene(w, h):
    """Smooth colour waves, a gradient and a hard-edged block: something a resampler can get wrong."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    arr = np.stack([127 + 100 * np.sin(x / 23.0) * np.cos(y / 31.0), 255 * x / w,
                    127 + 90 * np.sin((x + y) / 11.0)], -1)
    arr[h // 3: h // 2, w // 4: w // 2] = (250, 20, 40)
    return np.clip(arr, 0, 255).astype(np.uint8)


def encode(arr, fmt="JPEG", mode=None, **kw):
    img = Image.fromarray(arr)
    if mode:
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


@pytest.mark.parametrize("size", [(1200, 900), (640, 480), (250, 180)])
def test_pixels_equal_pillow_draft_and_close_to_full_decode(size):
    data = encode(scene(*size), quality=90)
    turbo = TurboDecoder()
    out = turbo.decode_one(data, 336, 336)
    assert out.shape == (336, 336, 3) and out.dtype == np.uint8 and out.flags.c_contiguous
    assert turbo.fallbacks == 0                                   # TurboJPEG did it, not Pillow
    assert np.array_equal(out, PillowDecoder().decode_one(data, 336, 336))
    full = PillowDecoder(draft=False).decode_one(data, 336, 336)  # full-size decode + resize
    diff = np.abs(out.astype(int) - full.astype(int))
    assert diff.mean() < 1.0 and diff.max() <= 32                 # measured: 0.44 / 14 at 1200x900, 0 / 0 below


def test_scale_choice_is_pillow_draft_rule_and_used():
    assert scale_for(1200, 900, 336, 336) == 4                    # 1/2: 600x450 >= 336
    assert scale_for(640, 480, 336, 336) == 8                     # 5/8-7/8 are slower than full: not used
    assert scale_for(3000, 2800, 336, 336) == 1
    assert scale_for(100, 100, 336, 336) == 8
    assert scale_for(1200, 1100, 336, 336, scales=(3, 4, 8)) == 3  # opt-in 3/8: 450x413
    data = encode(scene(1200, 900))
    img = Image.open(io.BytesIO(data))
    img.draft("RGB", (336, 336))
    assert img.size == (600, 450)
    seen = []
    dec = TurboDecoder()
    real = dec._jpeg

    class Spy:                                                    # records what TurboJPEG returned
        decode_jpeg_header = staticmethod(real.decode_jpeg_header)

        @staticmethod
        def decode_jpeg(*a, **kw):
            seen.append(real.decode_jpeg(*a, **kw).shape)
            return real.decode_jpeg(*a, **kw)

    dec._jpeg = Spy()
    assert dec.decode_one(data, 336, 336).shape == (336, 336, 3)
    assert seen == [(450, 600, 4)]                                # DCT-scaled by 1/2, RGBX for the resize


def test_dynamic_policy_grayscale_jpeg_and_png_fallback():
    pol = DynamicPolicy(patch=14, merge=2, min_pixels=56 * 56, max_pixels=448 * 448)
    dec = TurboDecoder()
    gray = encode(scene(900, 300), mode="L")
    png = encode(scene(300, 900), fmt="PNG")
    a, b = dec.decode([gray, png], [(900, 300), (300, 900)], pol)
    assert dec.fallbacks == 1                                     # only the PNG went to Pillow
    (w1, h1), (w2, h2) = pol.target_size(900, 300), pol.target_size(300, 900)
    assert a.shape == (h1, w1, 3) and b.shape == (h2, w2, 3)
    assert np.array_equal(a[..., 0], a[..., 2])                   # grey stays grey in RGB
    ref = PillowDecoder().decode([gray, png], [(900, 300), (300, 900)], pol)
    assert np.array_equal(a, ref[0]) and np.array_equal(b, ref[1])


def test_cmyk_jpeg_goes_through_pillow():
    data = encode(scene(200, 150), mode="CMYK")
    dec = TurboDecoder()
    out = dec.decode_one(data, 56, 56)
    assert dec.fallbacks == 1 and np.array_equal(out, PillowDecoder().decode_one(data, 56, 56))


@pytest.mark.parametrize("kind", ["empty", "html", "half", "header-only", "garbled"])
def test_corrupt_images_are_none_and_counted_once(kind):
    good = encode(scene(400, 300), quality=90)
    data = {"empty": b"", "html": b"<html>not an image</html>" * 10, "half": good[: len(good) // 2],
            "header-only": good[:600],
            "garbled": good[:2000] + bytes(range(256)) * 8 + good[4048:]}[kind]
    if kind == "half":   # libjpeg alone would 'succeed' here, filling the missing rows with grey
        import simplejpeg

        assert simplejpeg.decode_jpeg(data, strict=False).shape == (300, 400, 3)
    dec = TurboDecoder()
    small = encode(scene(100, 100))
    out = dec.decode([small, data, small], [(100, 100), (400, 300), (100, 100)], FixedPolicy(56, 14))
    assert out[0].shape == (56, 56, 3) and out[2].shape == (56, 56, 3)
    assert out[1] is None and dec.pop_errors() == {"corrupt_image": 1}
    assert dec.pop_errors() == {}


def test_jpeg_pillow_tolerates_is_accepted_like_pillow():
    good = encode(scene(400, 300), quality=90)
    data = good[:1000] + b"\x00\x00" + good[1000:]       # extraneous bytes: TurboJPEG (strict) refuses
    dec = TurboDecoder()
    out = dec.decode_one(data, 56, 56)
    assert dec.fallbacks == 1 and out is not None
    assert np.array_equal(out, PillowDecoder().decode_one(data, 56, 56)) and dec.pop_errors() == {}


def test_decompression_bomb_rejected_from_header():
    data = encode(scene(1200, 1000))
    dec = TurboDecoder(max_pixels=1_000_000)
    assert dec.decode_one(data, 56, 56) is None
    assert dec.pop_errors() == {"image_too_large": 1}
    with pytest.raises(ValueError):
        TurboDecoder(resample="nearest-ish")
    with pytest.raises(ValueError):
        TurboDecoder(scales=(0, 8))
