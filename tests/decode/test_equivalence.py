"""Every decoder (TurboJPEG, Pillow, DALI CPU, the DALI stage on its CPU backend) returns what stock Pillow's
`ImageOps.exif_transpose(img).convert("RGB")` shows, for real-world variants generated here: EXIF orientations
1-8 (JPEG, PNG, WebP, TIFF, XMP), CMYK and YCCK JPEG, 16-bit PNG, palettes with transparency, animated GIF and
WebP (first frame), grey, ICC profiles, WebP, TIFF (LAB too), JPEG 2000 and BMP.

Tolerance (stated in docs and README): Pillow bit-exact; TurboJPEG and DALI at most 2 levels (of 255) on any
channel of any pixel and 0.5 on average (measured on this machine: 0 for every variant and decoder)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.image_zoo import reference, zoo
from vlmdata.decode import DynamicPolicy, PillowDecoder, TurboDecoder
from vlmdata.decode.dali import DaliCpuDecoder, DaliGpuStage, GpuStageOptions, Normalization
from vlmdata.ingest import check_image

NATIVE = DynamicPolicy(patch=16, merge=1, min_pixels=1, max_pixels=1 << 30)   # 64x48 stays 64x48
TOLERANCE = {"pillow": (0, 0.0), "turbo": (2, 0.5), "dali-cpu": (2, 0.5), "dali-stage": (2, 0.5)}
NAMES = sorted(zoo())


@pytest.fixture(scope="module")
def decoders():
    return {"pillow": PillowDecoder(), "turbo": TurboDecoder(), "dali-cpu": DaliCpuDecoder()}


def indexed_size(data: bytes) -> tuple[int, int]:
    """The (width, height) `vlmdata shard` records for the image (displayed size)."""
    return check_image(data, 1 << 30)[1:]


def assert_close(name: str, decoder: str, got: np.ndarray, want: np.ndarray) -> None:
    assert got is not None, f"{decoder} dropped {name}"
    assert got.shape == want.shape and got.dtype == np.uint8, (name, decoder, got.shape, want.shape)
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    worst, mean = TOLERANCE[decoder]
    assert diff.max() <= worst and diff.mean() <= mean, (name, decoder, int(diff.max()), float(diff.mean()))


@pytest.mark.parametrize("name", NAMES)
def test_every_decoder_shows_what_pillow_shows(decoders, name):
    data = zoo()[name]
    want = reference(data)
    assert indexed_size(data) == (want.shape[1], want.shape[0])        # index size == displayed size
    for label, dec in decoders.items():
        (got,) = dec.decode([data], [indexed_size(data)], NATIVE)
        assert_close(name, label, got, want)
        assert dec.pop_errors() == {}


def test_the_dali_stage_shows_what_pillow_shows():
    norm = Normalization()
    stage = DaliGpuStage(NATIVE, GpuStageOptions(device="cpu", dtype="float32", normalize=norm))
    data = [zoo()[n] for n in NAMES]
    dec = stage.decode(data, np.asarray([indexed_size(d) for d in data], dtype=np.int32))
    assert dec.bad == [] and stage.fallbacks["format"] > 0
    mean = torch.tensor(norm.mean).reshape(3, 1, 1)
    std = torch.tensor(norm.std).reshape(3, 1, 1)
    start = 0
    for name, d in zip(NAMES, data):
        want = reference(d)
        h, w = want.shape[:2]
        n = (h // 16) * (w // 16)
        patches = dec.pixel_values[start:start + n]
        start += n
        img = patches.reshape(h // 16, w // 16, 3, 16, 16).permute(2, 0, 3, 1, 4).reshape(3, h, w)
        pixels = (img * std + mean).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
        assert_close(name, "dali-stage", pixels, want)


@pytest.mark.parametrize("name", ["jpeg_exif_6", "jpeg_exif_7", "png_exif_6", "tiff_exif_6", "cmyk_jpeg"])
def test_resized_decodes_agree_too(decoders, name):
    """At a smaller target (resize after decode), turned images still match the reference resized."""
    from PIL import Image

    data = zoo()[name]
    policy = DynamicPolicy(patch=8, merge=1, min_pixels=1, max_pixels=32 * 24)
    w, h = indexed_size(data)
    tw, th = policy.target_size(w, h)
    want = np.asarray(Image.fromarray(reference(data)).resize((tw, th), Image.Resampling.BILINEAR))
    for label, dec in decoders.items():
        (got,) = dec.decode([data], [(w, h)], policy)
        assert got.shape == want.shape, (name, label)
        assert np.abs(got.astype(np.int16) - want.astype(np.int16)).mean() < 4, (name, label)
