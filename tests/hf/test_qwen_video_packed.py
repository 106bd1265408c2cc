"""Videos through tiny random Qwen2-VL and Qwen2.5-VL models (issue 22 items 5-6): a pack loaded from a
LLaVA-Video JSON sharded with a Qwen2-VL folder (clips made at test time, images, text-only samples) gives,
through the output adapter, the same loss and gradients (fp32, 1e-5) as each sample run alone with the model
computing its own positions (its `get_rope_index` over `mm_token_type_ids`, image 1 / video 2); a moved
boundary fails that check; and the adapter's M-RoPE positions equal the model's rope index per sample
(Qwen2-VL: the temporal patch index; Qwen2.5-VL: t * second_per_grid_t * tokens_per_second)."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.hf import qwen_config, tiny_model, write_qwen2_5_folder
from tests.helpers.models import qwen_folder_or_skip
from tests.helpers.video_packs import (
    adapter_inputs,
    assert_bucket_positions_are_packed,
    assert_packed_equals_alone,
    assert_positions_are_the_rope_index,
)
from tests.video.qwen_video_corpus import qwen_video_folder, shard_corpus
from vlmdata import VLMDataset
from vlmdata.hf import ModelSpec

IDS = [151655, 151652, 151653, 151656]        # image, vision start, vision end, video (the Qwen2 tokenizer's)
VOCAB = 151936


def _write_qwen2(path: str) -> str:
    import json
    import os

    os.makedirs(path, exist_ok=True)
    qwen_config(VOCAB, *IDS).save_pretrained(path)
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump({"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, "merge_size": 2,
                   "temporal_patch_size": 2, "min_pixels": 56 * 56, "max_pixels": 12845056}, f)
    return path


WRITERS = {"qwen2-vl": _write_qwen2, "qwen2.5-vl": lambda p: write_qwen2_5_folder(p, ids=IDS, vocab_size=VOCAB)}


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("qvideo-hf")
    folder = qwen_video_folder(qwen_folder_or_skip(), str(root / "qwen2-vl"))
    ds = shard_corpus(str(root), folder)
    batches = list(VLMDataset(ds, max_tokens=8192))
    assert len(batches) == 1 and len(batches[0]["sample_keys"]) == 6
    b = batches[0]
    assert b["video_grid"].shape[0] == 5 and b["image_grid"].shape[0] == 2
    b["_root"] = ds            # where it was loaded from (read by the bucket test; dropped before the adapter)
    return b


@pytest.fixture(scope="module", params=sorted(WRITERS))
def model_and_spec(request, tmp_path_factory):
    folder = WRITERS[request.param](str(tmp_path_factory.mktemp(request.param)))
    spec = ModelSpec.from_folder(folder)
    assert spec.family == request.param and spec.video_token_id == IDS[3]
    return tiny_model(folder), spec


def test_video_fields_reach_the_model_in_its_layout(model_and_spec, pack):
    _, spec = model_and_spec
    inputs = adapter_inputs(spec, pack)
    assert inputs["pixel_values_videos"].dtype == torch.float32
    assert inputs["pixel_values_videos"].shape == (int(inputs["video_grid_thw"].prod(dim=1).sum()), 3 * 2 * 14 * 14)
    assert ("second_per_grid_ts" in inputs) == (spec.family == "qwen2.5-vl")
    mean = torch.tensor(spec.image_mean).view(1, 3, 1)
    std = torch.tensor(spec.image_std).view(1, 3, 1)
    raw = pack["pixel_values_videos"].view(len(pack["pixel_values_videos"]), 3, -1).float()
    want = ((raw / 255 - mean) / std).reshape(inputs["pixel_values_videos"].shape)
    assert float((inputs["pixel_values_videos"] - want).abs().max()) <= 1e-5


def test_positions_equal_the_models_rope_index_per_sample(model_and_spec, pack):
    model, spec = model_and_spec
    assert assert_positions_are_the_rope_index(model, spec, adapter_inputs(spec, pack)) == 5


def test_packed_equals_sum_of_samples_and_a_moved_boundary_fails(model_and_spec, pack):
    model, spec = model_and_spec
    assert_packed_equals_alone(model, spec, adapter_inputs(spec, pack))


def test_bucket_rows_get_the_positions_of_their_packed_samples(model_and_spec, pack):
    """Bucket mode (rows padded to the longest): each row's M-RoPE positions are its packed sample's."""
    assert assert_bucket_positions_are_packed(model_and_spec[1], pack, pack["_root"]) == 6
