"""Processor-exact decoding (issue 21): `ExactDecoder` + the adapters' normalisation give transformers' PIL image
processors' `pixel_values` for real-world files (EXIF orientations, palettes with transparency, CMYK, 16-bit,
animations, 64 to 1,344 px JPEGs of extreme aspect ratios), each processor with its own defaults; the fast
mode (draft decode, bilinear) does not."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.exact_pixels import hf_pixels, max_diff, qwen_rows, sized_jpegs
from tests.helpers.image_zoo import zoo
from vlmdata.decode import DynamicPolicy, ExactDecoder, FixedPolicy, PillowDecoder, make_decoder
from vlmdata.hf import clip_pixels
from vlmdata.ingest import check_image
from vlmdata.text.families import VisionSpec

TOLERANCE = 1e-5


def _images() -> dict[str, bytes]:
    return {**{k: v for k, v in zoo().items() if k != "jpeg2000" or _has_jpeg2000()}, **sized_jpegs()}


def _has_jpeg2000() -> bool:
    from PIL import features

    return bool(features.check("jpg_2000"))


def _qwen_reference():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil()
    policy = DynamicPolicy(proc.patch_size, proc.merge_size, proc.size["shortest_edge"], proc.size["longest_edge"])
    spec = VisionSpec(image_token="<|image_pad|>", image_token_id=0, vision_start_id=None, vision_end_id=None,
                      patch_size=proc.patch_size, merge_size=proc.merge_size,
                      temporal_patch_size=proc.temporal_patch_size, image_mean=tuple(proc.image_mean),
                      image_std=tuple(proc.image_std), min_pixels=policy.min_pixels, max_pixels=policy.max_pixels,
                      image_size=None, resample=int(proc.resample), policy=policy.to_dict())
    return proc, policy, spec


def _decode(decoder, data: bytes, policy) -> np.ndarray:
    _, w, h = check_image(data, 1 << 30)
    out = decoder.decode([data], [(w, h)], policy)[0]
    assert out is not None and decoder.pop_errors() == {}
    return out


def _qwen_diffs(decoder, proc, policy, spec) -> dict[str, float]:
    diffs = {}
    for name, data in _images().items():
        ref = hf_pixels(proc, data)
        image = _decode(decoder, data, policy)
        assert policy.grid(image.shape[1], image.shape[0]) == tuple(ref["image_grid_thw"][0, 1:].tolist()), name
        diffs[name] = max_diff(qwen_rows(image, spec), ref["pixel_values"])
    return diffs


def test_exact_pixels_equal_the_qwen2_vl_image_processor():
    proc, policy, spec = _qwen_reference()
    diffs = _qwen_diffs(make_decoder("auto", pixels="exact", resample=spec.resample), proc, policy, spec)
    assert len(diffs) >= 40
    assert max(diffs.values()) <= TOLERANCE, {k: v for k, v in diffs.items() if v > TOLERANCE}


def test_fast_pixels_are_not_the_processors():
    """What the loader gave before issue 21: draft decode + bilinear differs wherever an image is resized."""
    proc, policy, spec = _qwen_reference()
    diffs = _qwen_diffs(PillowDecoder(), proc, policy, spec)
    resized = [k for k in sized_jpegs()]
    assert all(diffs[k] > 0.01 for k in resized), diffs


def test_the_folders_resample_filter_is_used():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    _, policy, spec = _qwen_reference()
    bilinear = Qwen2VLImageProcessorPil(resample=2)
    data = sized_jpegs()["jpeg_1344x1008"]
    ref = hf_pixels(bilinear, data)["pixel_values"]
    assert max_diff(qwen_rows(_decode(ExactDecoder(resample=2), data, policy), spec), ref) <= TOLERANCE
    assert max_diff(qwen_rows(_decode(ExactDecoder(resample=3), data, policy), spec), ref) > 0.01


def test_exact_pixels_equal_the_clip_image_processor_resize_and_centre_crop():
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    proc = CLIPImageProcessorPil()
    side = proc.crop_size["height"]
    assert proc.size["shortest_edge"] == side
    policy = FixedPolicy(size=side, patch=14)
    decoder = make_decoder("pillow", pixels="exact", resample=int(proc.resample), crop=True)
    worst = {}
    for name, data in _images().items():
        image = torch.from_numpy(np.array(_decode(decoder, data, policy))).permute(2, 0, 1)[None].contiguous()
        got = clip_pixels(image, side, proc.image_mean, proc.image_std, torch.float32)
        worst[name] = max_diff(got, hf_pixels(proc, data)["pixel_values"])
    assert max(worst.values()) <= TOLERANCE, {k: v for k, v in worst.items() if v > TOLERANCE}


def test_exact_mode_refuses_fast_only_decoders_and_unknown_modes():
    with pytest.raises(ValueError, match="fast pixels only"):
        make_decoder("turbo", pixels="exact")
    with pytest.raises(ValueError, match="'exact'.*'fast'"):
        make_decoder("auto", pixels="precise")
    assert isinstance(make_decoder("auto", pixels="exact"), ExactDecoder)
    assert not isinstance(make_decoder("pillow"), ExactDecoder)


def test_a_bad_image_costs_only_itself():
    decoder = ExactDecoder()
    good = sized_jpegs()["jpeg_64x64"]
    out = decoder.decode([good[: len(good) // 3], b"not an image", good], [(64, 64)] * 3, FixedPolicy(56, 14))
    assert out[0] is None and out[1] is None and out[2].shape == (56, 56, 3)
    assert sum(decoder.pop_errors().values()) == 2
