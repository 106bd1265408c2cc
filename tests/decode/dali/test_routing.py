"""DALI gets the images it decodes like Pillow; GIF, TIFF, 16-bit PNG and unknown signatures go to the CPU
decoder up front, anything DALI fails on afterwards; every fallback is counted, no image is dropped for it."""
from __future__ import annotations

from tests.helpers.image_zoo import zoo
from vlmdata.decode import DynamicPolicy
from vlmdata.decode.dali import DaliCpuDecoder, cpu_only, plan_decode
from vlmdata.ingest import check_image

NATIVE = DynamicPolicy(patch=16, merge=1, min_pixels=1, max_pixels=1 << 30)


def test_cpu_only_formats():
    z = zoo()
    assert [n for n in sorted(z) if cpu_only(z[n])] == [
        "animated_gif", "lab_tiff", "palette_gif_trns", "png16_grey", "png16_rgb", "tiff_exif_3", "tiff_exif_6",
        "tiff_lzw"]
    assert cpu_only(b"<html>") and cpu_only(b"")


def test_plan_turns_targets_for_rotated_images():
    z = zoo()
    names = ["jpeg", "jpeg_exif_6", "jpeg_exif_3", "animated_gif"]
    hw = [(48, 64), (64, 48), (48, 64), (48, 64)]          # displayed (height, width)
    plan = plan_decode([z[n] for n in names], hw)
    assert plan.dali == [0, 1, 2] and plan.cpu == [3]
    assert plan.dali_hw == [(48, 64), (48, 64), (48, 64)]   # the rotated one is decoded stored-shape, then turned
    assert plan.orientation == [1, 6, 3, 1]
    old = plan_decode([z["jpeg_exif_6"]], [(48, 64)])        # an index written before orientation was applied
    assert old.orientation == [1] and old.dali_hw == [(48, 64)]


def test_gif_tiff_and_16bit_png_are_decoded_not_dropped():
    z = zoo()
    names = ["palette_gif_trns", "animated_gif", "png16_grey", "lab_tiff", "jpeg", "webp_lossy", "bmp_palette"]
    dec = DaliCpuDecoder()
    out = dec.decode([z[n] for n in names], [check_image(z[n], 1 << 30)[1:] for n in names], NATIVE)
    assert all(o is not None and o.shape == (48, 64, 3) for o in out)
    assert dec.fallbacks == {"format": 4} and dec.runner.errors == {} and dec.pop_errors() == {}
