"""Pixels: vlmdata's uint8 layout becomes exactly what the processors give (Qwen2-VL patches, LLaVA images)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.hf import (
    llava_processor,
    make_conversations,
    qwen_processor,
    reference_pack,
    references,
    write_llava_folder,
    write_qwen_folder,
)
from vlmdata.decode import FixedPolicy, pack_patches
from vlmdata.errors import AdapterError
from vlmdata.hf import ModelSpec, clip_pixels, fixed_to_patches, make_adapter, qwen_patches


def _processor_pixels(refs):
    return torch.cat([r.processor_out["pixel_values"] for r in refs if "pixel_values" in r.processor_out])


def test_qwen_patches_equal_the_processor_bit_for_bit(tmp_path):
    proc = qwen_processor()
    spec = ModelSpec.from_folder(write_qwen_folder(str(tmp_path), proc))
    refs = references(make_conversations(8, seed=3), proc, "qwen2-vl", spec.image_policy(), exact=True)
    pack = reference_pack(refs, spec.image_policy(), spec.image_token_id)
    assert pack["pixel_values"].dtype == torch.uint8 and pack["pixel_values"].shape[1] == 3 * 14 * 14
    adapter = make_adapter(spec)
    inputs = adapter.finalize(adapter(pack))
    want = _processor_pixels(refs)
    assert inputs["pixel_values"].shape == want.shape == (want.shape[0], 3 * 2 * 14 * 14)
    assert torch.equal(inputs["pixel_values"], want)
    grids = torch.cat([r.processor_out["image_grid_thw"] for r in refs if "image_grid_thw" in r.processor_out])
    assert torch.equal(inputs["image_grid_thw"], grids)
    bf16 = adapter.finalize(adapter(pack), dtype=torch.bfloat16)["pixel_values"]
    assert bf16.dtype == torch.bfloat16 and torch.equal(bf16, want.to(torch.bfloat16))


def test_llava_images_equal_the_processor_bit_for_bit(tmp_path):
    proc = llava_processor()
    spec = ModelSpec.from_folder(write_llava_folder(str(tmp_path), proc))
    refs = references(make_conversations(4, seed=4, max_images=1), proc, "llava", spec.image_policy(), exact=True)
    pack = reference_pack(refs, spec.image_policy(), spec.image_token_id)
    assert pack["pixel_values"].shape[1:] == (3, 336, 336)
    inputs = make_adapter(spec).finalize(make_adapter(spec)(pack))
    assert torch.equal(inputs["pixel_values"], _processor_pixels(refs))


def test_fixed_policy_patches_match_vlmdata_patch_layout():
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (56, 84, 3), dtype=np.uint8) for _ in range(2)]
    rows, grid, _ = pack_patches(images, 14, 2)
    chw = torch.from_numpy(np.stack([im.transpose(2, 0, 1) for im in images]))
    got, got_grid = fixed_to_patches(chw, 14, 2)
    assert torch.equal(got, torch.from_numpy(rows))
    assert got_grid.tolist() == grid.tolist() == [[1, 4, 6], [1, 4, 6]]


def test_qwen_fixed_policy_pack(tmp_path):
    proc = qwen_processor()
    spec = ModelSpec.from_folder(write_qwen_folder(str(tmp_path), proc))
    policy = FixedPolicy(size=112, patch=14, merge=2)
    refs = references(make_conversations(3, seed=8, max_images=1), proc, "qwen2-vl", policy)
    pack = reference_pack(refs, policy, spec.image_token_id)
    assert pack["pixel_values"].dim() == 4
    inputs = make_adapter(spec).finalize(make_adapter(spec)(pack))
    assert torch.equal(inputs["pixel_values"], _processor_pixels(refs))
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 8]] * len(inputs["image_grid_thw"])


def test_normalised_pixels_pass_through_and_bad_shapes():
    rows = torch.randn(4, 3 * 14 * 14)
    out = qwen_patches(rows, 14, 2, (0.5,) * 3, (0.5,) * 3, torch.float32)
    assert torch.equal(out.view(4, 3, 2, 196)[:, :, 1], rows.view(4, 3, 196))     # frame repeated, values kept
    with pytest.raises(AdapterError, match="3\\*16\\*16"):
        qwen_patches(torch.zeros(4, 588, dtype=torch.uint8), 16, 2, (0.5,) * 3, (0.5,) * 3, torch.float32)
    with pytest.raises(AdapterError, match="FixedPolicy\\(336\\)"):
        clip_pixels(torch.zeros(1, 3, 224, 224, dtype=torch.uint8), 336, (0.5,) * 3, (0.5,) * 3, torch.float32)
    with pytest.raises(AdapterError, match="multiples of patch\\*merge"):
        fixed_to_patches(torch.zeros(1, 3, 50, 56, dtype=torch.uint8), 14, 2)
