"""Videos through a tiny random LLaVA-OneVision (issue 22 item 5): a LLaVA-Video JSON (clips made at test time, one
shorter than the policy's N frames, an image sample and a sample with an image and a clip) sharded with the tiny folder
loads into one pack (planned lengths = built lengths, the per-sample path = the fast path) whose adapter inputs stack
the clips as the model's `pixel_values_videos` [videos, N, 3, S, S], normalised; the model's video features fill
exactly the `<video>` runs, and the pack's loss and gradients equal the sum over its samples run alone (fp32, 1e-5),
which a moved boundary breaks."""
from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from tests.helpers.hf import ONEVISION_TILE, tiny_model, write_onevision_folder
from tests.helpers.video_packs import adapter_inputs, assert_packed_equals_alone, assert_trainer_trains_tower
from tests.video.qwen_video_corpus import (
    assert_bucket_rows_are_fast_pack_samples,
    assert_planned_lengths_are_built,
)
from vlmdata import VLMDataset
from vlmdata.hf import ModelSpec
from vlmdata.ingest import ShardConfig, shard_dataset
from vlmdata.testing import ClipSpec, make_clip

pytestmark = pytest.mark.slow                 # sharding the corpus and the tiny model: ~8 s together

N = 4                                   # frames per clip (the folder's video config)
PER_CLIP = N * (ONEVISION_TILE // 14 // 2) ** 2 + 1


def _turns(question: str, answer: str) -> list[dict]:
    return [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("ov-video")
    folder = write_onevision_folder(str(root / "ov"))
    (root / "ov/video_preprocessor_config.json").write_text(json.dumps(
        {"video_processor_type": "LlavaOnevisionVideoProcessor", "num_frames": N, "image_mean": [0.5] * 3,
         "image_std": [0.5] * 3, "size": {"height": ONEVISION_TILE, "width": ONEVISION_TILE}}))
    (root / "raw").mkdir()
    (root / "raw/a.mp4").write_bytes(make_clip(ClipSpec(frames=30, fps=10, width=64, height=48)))
    (root / "raw/b.webm").write_bytes(make_clip(ClipSpec(container="webm", codec="libvpx-vp9", frames=3, fps=10,
                                                         width=40, height=40)))
    Image.new("RGB", (90, 40), (20, 140, 30)).save(root / "raw/still.png")
    rows = [{"id": "clip", "video": "a.mp4", "conversations": _turns("<video>\nwhat happens ?", "a dog runs")},
            {"id": "still", "image": "still.png", "conversations": _turns("<image>\nwhat colour ?", "green")},
            {"id": "short", "video": "b.webm", "conversations": _turns("<video>\nand this ?", "a cat")},
            {"id": "mix", "video": "a.mp4", "image": "still.png",
             "conversations": _turns("<image>\nthis and <video> the clip ?", "the same")}]
    (root / "raw/data.json").write_text(json.dumps(rows))
    m = shard_dataset(ShardConfig(inputs=[str(root / "raw/data.json")], output=str(root / "ds"), tokenizer=folder,
                                  workers=0))
    assert m.num_samples == 4 and not m.stats.get("skipped")          # the clips are sharded, not skipped
    batches = list(VLMDataset(str(root / "ds"), max_tokens=4096))
    assert len(batches) == 1 and len(batches[0]["sample_keys"]) == 4
    spec = ModelSpec.from_folder(folder)
    assert spec.video_token_id == tiny_model(folder).config.video_token_id
    return folder, spec, batches[0], str(root / "ds")


def test_planned_lengths_are_the_built_ones(packed):
    """The planner counts N * ceil(side/2)² + 1 tokens per clip from the index, before any decode."""
    assert_planned_lengths_are_built(packed[3], max_tokens=2048)


def test_the_per_sample_path_expands_videos_as_the_fast_path(packed):
    assert_bucket_rows_are_fast_pack_samples(packed[3])


def test_a_mixed_sample_puts_its_image_before_its_clip_as_the_template_does(packed):
    _, spec, pack, _ = packed
    at = list(pack["sample_keys"]).index("mix")
    ids = pack["input_ids"].reshape(-1)[pack["cu_seqlens"][at]:pack["cu_seqlens"][at + 1]]
    img, vid = (torch.nonzero(ids == t)[:, 0] for t in (spec.image_token_id, spec.video_token_id))
    assert len(img) and len(vid) == PER_CLIP and int(img.max()) < int(vid.min())


def test_clips_reach_the_model_stacked_and_normalised(packed):
    _, spec, pack, _ = packed
    inputs = adapter_inputs(spec, pack)
    videos = inputs["pixel_values_videos"]
    assert videos.shape == (3, N, 3, ONEVISION_TILE, ONEVISION_TILE) and videos.dtype == torch.float32
    raw = pack["pixel_values_videos"].float().view(3, N, 3, ONEVISION_TILE, ONEVISION_TILE)
    assert float((videos - (raw / 255 - 0.5) / 0.5).abs().max()) <= 1e-6
    assert int((inputs["input_ids"] == spec.video_token_id).sum()) == 3 * PER_CLIP
    assert "video_frames" not in inputs                     # host-only: not a forward argument


def _alone(spec, inputs: dict) -> list[dict]:
    """Each packed sample alone: its ids and labels, its clips (PER_CLIP video tokens each) and its image (each
    image sample here holds one, tiled alone: one entry of batch_num_images); the model numbers positions itself."""
    cu = inputs["cu_seq_lens_q"].tolist()
    assert inputs["batch_num_images"].tolist() == [1] * len(inputs["image_sizes"])
    out, clip, image = [], 0, 0
    for a, b in zip(cu[:-1], cu[1:]):
        ids = inputs["input_ids"][0, a:b]
        one = {"input_ids": ids[None], "labels": inputs["labels"][0, a:b][None]}
        n = int((ids == spec.video_token_id).sum()) // PER_CLIP
        if n:
            one["pixel_values_videos"] = inputs["pixel_values_videos"][clip:clip + n]
            clip += n
        if int((ids == spec.image_token_id).sum()):
            one.update(pixel_values=inputs["pixel_values"][image:image + 1],
                       image_sizes=inputs["image_sizes"][image:image + 1], batch_num_images=torch.tensor([1]))
            image += 1
        out.append(one)
    return out


def test_packed_loss_and_gradients_equal_each_sample_alone(packed):
    folder, spec, pack, _ = packed
    assert_packed_equals_alone(tiny_model(folder), spec, adapter_inputs(spec, pack), alone=_alone,
                               tower="model.vision_tower")


def test_vlm_trainer_trains_on_the_video_packs(packed, tmp_path):
    """VLMTrainer on the sharded clips and images: finite losses, the vision tower trains, every sample once per epoch."""
    folder, _, _, ds_path = packed
    assert_trainer_trains_tower(tiny_model(folder), ds_path, tmp_path / "out", samples=4)
