"""Videos through a tiny random InternVL3 (issue 22 item 5): a LLaVA-Video JSON (clips made at test time, one shorter
than the policy's N frames, an image sample, samples with an image before and after a clip) sharded with the tiny
folder loads into one pack whose `pixel_values` hold every image tile and clip frame in token order (normalised
with the image mean/std, one `<IMG_CONTEXT>` run of image_seq_length per tile); the pack's loss and gradients equal
the sum over its samples run alone (fp32, 1e-5), which a moved boundary breaks, and VLMTrainer trains on it."""
from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from tests.helpers.hf import INTERNVL_PER_TILE, INTERNVL_TILE, tiny_model, write_internvl_folder
from tests.helpers.video_packs import adapter_inputs, assert_packed_equals_alone, assert_trainer_trains_tower
from vlmdata import VLMDataset
from vlmdata.hf import ModelSpec
from vlmdata.ingest import ShardConfig, shard_dataset
from vlmdata.testing import ClipSpec, make_clip

pytestmark = pytest.mark.slow                 # sharding the corpus and the tiny model: ~5 s together

N = 3                                   # frames per clip (the folder's video config)


def _turns(question: str, answer: str) -> list[dict]:
    return [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("ivl-video")
    folder = write_internvl_folder(str(root / "ivl"))
    (root / "ivl/video_preprocessor_config.json").write_text(json.dumps(
        {"video_processor_type": "InternVLVideoProcessor", "num_frames": N, "image_mean": [0.485, 0.456, 0.406],
         "image_std": [0.229, 0.224, 0.225], "size": {"height": INTERNVL_TILE, "width": INTERNVL_TILE}}))
    (root / "raw").mkdir()
    (root / "raw/a.mp4").write_bytes(make_clip(ClipSpec(frames=30, fps=10, width=64, height=48)))
    (root / "raw/b.webm").write_bytes(make_clip(ClipSpec(container="webm", codec="libvpx-vp9", frames=2, fps=10,
                                                         width=40, height=40)))
    Image.new("RGB", (150, 50), (20, 140, 30)).save(root / "raw/wide.png")
    rows = [{"id": "clip", "video": "a.mp4", "conversations": _turns("<video>\nwhat is in it", "a dog")},
            {"id": "still", "image": "wide.png", "conversations": _turns("<image>\nwhat colour", "green")},
            {"id": "short", "video": "b.webm", "conversations": _turns("<video>\nand this", "a cat")},
            {"id": "mix", "video": "a.mp4", "image": "wide.png",
             "conversations": _turns("<image>\nthis and <video> the clip", "the same")},
            {"id": "clip_first", "video": "b.webm", "image": "wide.png",
             "conversations": _turns("<video> and then <image>\nwhat", "two")}]
    (root / "raw/data.json").write_text(json.dumps(rows))
    m = shard_dataset(ShardConfig(inputs=[str(root / "raw/data.json")], output=str(root / "ds"), tokenizer=folder,
                                  workers=0))
    assert m.num_samples == 5 and not m.stats.get("skipped")          # the clips are sharded, not skipped
    batches = list(VLMDataset(str(root / "ds"), max_tokens=4096))
    assert len(batches) == 1 and len(batches[0]["sample_keys"]) == 5
    return folder, ModelSpec.from_folder(folder), batches[0], str(root / "ds")


ORDER = {"clip": "v", "still": "i", "short": "v", "mix": "iv", "clip_first": "vi"}     # each row's visuals, in its text


def test_frames_and_tiles_reach_pixel_values_in_token_order(packed):
    """pixel_values: sample after sample, each one's images' tiles and clips' frames in the order its text names them
    (rebuilt here from the pack's own tiles and frames), normalised with the image mean/std; one `<IMG_CONTEXT>`
    run per row."""
    _, spec, pack, _ = packed
    inputs = adapter_inputs(spec, pack)
    tiles = iter(torch.split(pack["pixel_values"], pack["image_tiles"].tolist()))
    clips = iter(pack["pixel_values_videos"].view(-1, N, 3, INTERNVL_TILE, INTERNVL_TILE))
    want = torch.cat([next(clips if kind == "v" else tiles) for key in pack["sample_keys"] for kind in ORDER[key]])
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (spec.image_mean, spec.image_std))
    got = inputs["pixel_values"]
    assert got.shape == want.shape and float((got - (want.float() / 255 - mean) / std).abs().max()) <= 1e-5
    assert len(got) == int((inputs["input_ids"] == spec.image_token_id).sum()) // INTERNVL_PER_TILE
    assert len(pack["pixel_values_videos"]) == N * sum(o.count("v") for o in ORDER.values())
    assert len(pack["image_tiles"]) == sum(o.count("i") for o in ORDER.values())


def _alone(spec, inputs: dict) -> list[dict]:
    """Each packed sample alone: its ids, labels and its rows of pixel_values (its `<IMG_CONTEXT>` runs)."""
    cu = inputs["cu_seq_lens_q"].tolist()
    out, at = [], 0
    for a, b in zip(cu[:-1], cu[1:]):
        ids = inputs["input_ids"][0, a:b]
        one = {"input_ids": ids[None], "labels": inputs["labels"][0, a:b][None]}
        n = int((ids == spec.image_token_id).sum()) // INTERNVL_PER_TILE
        if n:
            one["pixel_values"] = inputs["pixel_values"][at:at + n]
            at += n
        out.append(one)
    return out


def test_packed_loss_and_gradients_equal_each_sample_alone(packed):
    folder, spec, pack, _ = packed
    assert_packed_equals_alone(tiny_model(folder), spec, adapter_inputs(spec, pack), alone=_alone,
                               tower="model.vision_tower")


def test_vlm_trainer_trains_on_the_video_packs(packed, tmp_path):
    """VLMTrainer on the sharded clips and images: finite losses, the vision tower trains, every sample once per epoch."""
    folder, _, _, ds_path = packed
    assert_trainer_trains_tower(tiny_model(folder), ds_path, tmp_path / "out", samples=5)
