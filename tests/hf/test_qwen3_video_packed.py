"""Videos through a tiny random Qwen3-VL (issue 22 items 5-6): a pack loaded from a LLaVA-Video JSON sharded with a
Qwen3-VL folder (the Qwen tokenizer; a sample with two clips made at test time, an image sample, a text one) gives,
through the output adapter, the same loss and gradients (fp32, 1e-5) as each sample run alone with the model
computing its own positions (`get_rope_index` over `mm_token_type_ids`: each temporal patch a one-frame grid,
the `<t seconds>` timestamps text between them); a moved boundary fails that check; and the adapter's M-RoPE
positions equal the model's rope index per sample."""
from __future__ import annotations

import shutil

import pytest
import torch

from tests.helpers.hf import qwen3_config, tiny_model
from tests.helpers.models import qwen3_folder_or_skip
from tests.helpers.video_packs import (
    adapter_inputs,
    assert_bucket_positions_are_packed,
    assert_packed_equals_alone,
    assert_positions_are_the_rope_index,
)
from tests.video.qwen_video_corpus import QWEN3_VIDEO_CONFIG, qwen_video_folder, shard_corpus
from vlmdata import VLMDataset
from vlmdata.hf import ModelSpec

pytestmark = pytest.mark.slow

IDS = [151655, 151652, 151653, 151656]        # image, vision start, vision end, video (the Qwen2 tokenizer's)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("q3video-hf")
    folder = qwen_video_folder(qwen3_folder_or_skip(), str(root / "qwen3-vl"), QWEN3_VIDEO_CONFIG,
                               "Qwen3VLVideoProcessor")
    qwen3_config(151936, *IDS).save_pretrained(folder)          # the tiny model's config in the sharding folder
    ds = shard_corpus(str(root), folder, only={"v_two", "i_only", "t_only"})
    batches = list(VLMDataset(ds, max_tokens=8192))
    assert len(batches) == 1 and len(batches[0]["sample_keys"]) == 3
    pack = batches[0]
    assert pack["video_grid"].shape[0] == 2 and pack["image_grid"].shape[0] == 1
    spec = ModelSpec.from_folder(folder)
    assert spec.family == "qwen3-vl" and spec.video_token_id == IDS[3]
    model = tiny_model(folder)
    shutil.rmtree(str(root / "raw"))
    return model, spec, pack, ds


def test_video_tokens_are_marked_and_the_vision_markers_repeat_per_frame(setup):
    _, spec, pack, _ = setup
    inputs = adapter_inputs(spec, pack)
    ids, types = inputs["input_ids"][0], inputs["mm_token_type_ids"][0]
    assert torch.equal(types == 2, ids == IDS[3]) and torch.equal(types == 1, ids == IDS[0])
    frames = int(pack["video_grid"][:, 0].sum())
    images = pack["image_grid"].shape[0]
    # one <|vision_start|> per image, per video (the template's) and per temporal patch (the processor's)
    assert int((ids == IDS[1]).sum()) == images + 2 + frames
    assert inputs["pixel_values_videos"].shape == (int(inputs["video_grid_thw"].prod(dim=1).sum()), 3 * 2 * 16 * 16)


def test_positions_equal_the_models_rope_index_per_sample(setup):
    model, spec, pack, _ = setup
    assert assert_positions_are_the_rope_index(model, spec, adapter_inputs(spec, pack)) == 2


def test_packed_equals_sum_of_samples_and_a_moved_boundary_fails(setup):
    model, spec, pack, _ = setup
    assert_packed_equals_alone(model, spec, adapter_inputs(spec, pack))


def test_bucket_rows_get_the_positions_of_their_packed_samples(setup):
    _, spec, pack, ds = setup
    assert assert_bucket_positions_are_packed(spec, pack, ds) == 3
