"""Qwen2.5-VL and Qwen3-VL through the output adapter (issue 21): with the real transformers classes (their
processors, tiny randomly initialised models, fp32 on CPU), a pack's M-RoPE positions equal the model's own rope
index per sample, its pixels (and Qwen3-VL's `mm_token_type_ids`) equal the processor's (pixels from the original
files), and its loss and gradients equal the sum over its samples run alone (1e-5). Qwen2-VL and LLaVA are in
test_equality.py."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.hf import (
    check_packed_equals_alone,
    make_conversations,
    qwen2_5_processor,
    qwen3_processor,
    reference_pack,
    references,
    tiny_model,
    write_qwen2_5_folder,
    write_qwen3_folder,
)
from vlmdata.errors import AdapterError
from vlmdata.hf import (
    ModelSpec,
    Qwen3VLAdapter,
    QwenVLAdapter,
    make_adapter,
    mrope_position_ids,
    take_meta,
)

TOL = 1e-5
GENERATIONS = {  # family: (processor, folder writer, patch, mean/std, adapter)
    "qwen3-vl": (qwen3_processor, write_qwen3_folder, 16, (0.5, 0.5, 0.5), Qwen3VLAdapter),
    "qwen2.5-vl": (qwen2_5_processor, write_qwen2_5_folder, 14, (0.48145466, 0.4578275, 0.40821073), QwenVLAdapter),
}


@pytest.fixture(scope="module", params=sorted(GENERATIONS))
def qwen(request, tmp_path_factory):
    family = request.param
    make_processor, write_folder = GENERATIONS[family][:2]
    proc = make_processor()
    folder = write_folder(str(tmp_path_factory.mktemp(family)), proc)
    spec = ModelSpec.from_folder(folder)
    refs = references(make_conversations(6, seed=31, max_images=2), proc, family, spec.image_policy(), exact=True)
    assert sum(len(r.decoded) for r in refs) >= 4
    return folder, spec, refs


def test_spec_is_the_generations(qwen):
    _, spec, _ = qwen
    _, _, patch, mean, adapter = GENERATIONS[spec.family]
    assert (spec.patch_size, spec.merge_size, spec.temporal_patch_size) == (patch, 2, 2)
    assert spec.image_mean == mean
    assert type(make_adapter(spec)) is adapter


def test_pack_positions_equal_the_models_rope_index_per_sample(qwen):
    folder, spec, refs = qwen
    model = tiny_model(folder)
    pack = reference_pack(refs, spec.image_policy(), spec.image_token_id)
    pos = mrope_position_ids(pack["input_ids"], pack["cu_seqlens"], pack["image_grid"], spec.image_token_id,
                             spec.merge_size)
    bounds = pack["cu_seqlens"].tolist()
    for (a, b), ref in zip(zip(bounds[:-1], bounds[1:]), refs):
        want, _ = rope_index(model, ref.processor_out)
        assert torch.equal(pos[:, a:b], want[:, 0]), ref.key


def test_pixels_grids_and_token_types_equal_the_processors(qwen):
    _, spec, refs = qwen
    adapter = make_adapter(spec)
    host = adapter(reference_pack(refs, spec.image_policy(), spec.image_token_id))
    take_meta(host)
    inputs = adapter.finalize(host)
    with_images = [r.processor_out for r in refs if "pixel_values" in r.processor_out]
    want = torch.cat([o["pixel_values"] for o in with_images])
    assert inputs["pixel_values"].shape == want.shape and want.shape[1] == 3 * 2 * spec.patch_size ** 2
    assert float((inputs["pixel_values"] - want).abs().max()) <= 1e-5
    assert torch.equal(inputs["image_grid_thw"], torch.cat([o["image_grid_thw"] for o in with_images]))
    types = torch.cat([r.processor_out["mm_token_type_ids"][0] for r in refs])
    if spec.family == "qwen3-vl":
        assert torch.equal(inputs["mm_token_type_ids"][0], types)
    else:
        assert "mm_token_type_ids" not in inputs and int(types.sum()) > 0


@pytest.mark.parametrize("attn", ["sdpa", "vlmdata_varlen"])
def test_packed_equals_sum_of_samples(qwen, attn):
    folder, spec, refs = qwen
    check_packed_equals_alone(folder, spec, refs, attn)


def test_an_adapter_with_another_patch_size_is_refused(qwen):
    """The patch size matters: Qwen3-VL's 16 px patches are not Qwen2-VL's and Qwen2.5-VL's 14 px ones."""
    _, spec, refs = qwen
    other = ModelSpec.from_dict({**spec.to_dict(), "patch_size": 30 - spec.patch_size})
    adapter = make_adapter(other)
    with pytest.raises(AdapterError):
        adapter.finalize(adapter(reference_pack(refs, spec.image_policy(), spec.image_token_id)))


def rope_index(model, out: dict):
    """The model's own M-RoPE positions for one sample's processor output."""
    return model.model.get_rope_index(out["input_ids"], out["mm_token_type_ids"], out.get("image_grid_thw"))
