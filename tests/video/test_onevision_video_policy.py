"""LLaVA-OneVision's video policy against transformers' own LLaVA-OneVision code (issue 22 item 3): sampled frame
indices (`LlavaOnevisionVideoProcessor.sample_frames` with num_frames), token counts (`LlavaOnevisionProcessor`'s
`replace_video_token` and `_get_num_multimodal_tokens`), and frames of clips made at test time resized to the tile as
torch's antialiased bicubic (what the processor's torchvision resize calls; torchvision is not installed here) at the
reference's indices of a full PyAV decode; the family reads the folder's video config and refuses what it cannot lay
out."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from vlmdata.testing import ClipSpec, make_clip
from vlmdata.video import OnevisionVideoPolicy, make_video_policy, probe_clip

FRAMES = [32, 33, 60, 61, 99, 100, 301, 1000, 2386, 7201]


def reference_processor():
    import importlib

    # the module itself (the package's lazy attribute asks for torchvision); sample_frames needs none
    return importlib.import_module("transformers.models.llava_onevision.video_processing_llava_onevision")\
        .LlavaOnevisionVideoProcessor()


@pytest.mark.parametrize("n", [1, 8, 32])
def test_sampled_frames_equal_the_processors(n):
    from transformers.video_utils import VideoMetadata

    ref, pol = reference_processor(), OnevisionVideoPolicy(num_frames=n)
    for frames in FRAMES:
        want = ref.sample_frames(VideoMetadata(total_num_frames=frames, fps=30.0), num_frames=n)
        assert pol.frame_indices(frames).tolist() == np.asarray(want).tolist(), frames


def test_a_clip_shorter_than_n_takes_n_frames_by_the_same_rule():
    """transformers raises there; the policy repeats frames so every clip stacks to N frames."""
    from transformers.video_utils import VideoMetadata

    with pytest.raises(ValueError, match="exceeds"):
        reference_processor().sample_frames(VideoMetadata(total_num_frames=3, fps=10.0), num_frames=8)
    got = OnevisionVideoPolicy(num_frames=8).frame_indices(3)
    assert got.tolist() == [0, 0, 0, 1, 1, 1, 2, 2]


@pytest.mark.parametrize("side", [2, 3, 27])
def test_token_counts_equal_the_processors(side):
    from types import SimpleNamespace

    from transformers import LlavaOnevisionProcessor

    me = SimpleNamespace(num_image_tokens=side * side, video_token="<video>")
    for n in (1, 7, 8, 32):
        pol = OnevisionVideoPolicy(num_frames=n, side=side, tile=side * 14)
        replaced = LlavaOnevisionProcessor.replace_video_token(me, {"pixel_values_videos": [torch.zeros(n, 3, 1, 1)]}, 0)
        counted = LlavaOnevisionProcessor._get_num_multimodal_tokens(me, video_sizes=[(n, 480, 640)])
        want = replaced.count("<video>")
        assert counted["num_video_tokens"] == [want]
        assert pol.tokens(np.array([50, 500]), 30.0, 640, 480).tolist() == [want, want]


@pytest.mark.parametrize("spec", [ClipSpec(frames=60, fps=30), ClipSpec(frames=3, fps=10, width=80, height=80),
                                  ClipSpec(container="webm", codec="libvpx-vp9", frames=50, fps=25, width=96, height=54),
                                  ClipSpec(variable_rate=True, frames=40, fps=24, width=64, height=48)])
def test_clips_made_at_test_time_give_the_reference_frames_resized_to_the_tile(spec):
    import av
    import torch.nn.functional as F

    data = make_clip(spec)
    info = probe_clip(data)
    pol = OnevisionVideoPolicy(num_frames=8, tile=28, side=2)
    with av.open(io.BytesIO(data)) as c:
        every = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    idx = np.arange(8) * len(every) // 8                       # default_sample_indices_fn (repeats when short)
    t = torch.from_numpy(every[idx]).permute(0, 3, 1, 2)
    want = F.interpolate(t, size=(28, 28), mode="bicubic", antialias=True).numpy()
    got = pol.load(data, info.to_dict())
    assert info.frames == len(every)
    assert got.rows.dtype == np.uint8 and np.array_equal(got.rows, want.reshape(8, -1))
    assert got.grid == (8, 2, 2) and got.tokens == 8 * 1 + 1
    assert got.tokens == int(pol.tokens(info.frames, info.measured_fps, info.width, info.height))


def test_the_policys_defaults_are_the_processors():
    """384 px frames, bicubic; 384 / 14 = 27 features a side (the family reads side from the folder)."""
    ref, pol = reference_processor(), OnevisionVideoPolicy()
    assert (ref.size.height, ref.size.width) == (pol.tile, pol.tile) and int(ref.resample) == pol.resample
    assert pol.side == pol.tile // pol.patch == 27 and pol.per_frame() == 196


def test_the_policy_round_trips_through_its_manifest_dict():
    pol = OnevisionVideoPolicy(num_frames=4, tile=28, side=2, resample=2)
    assert make_video_policy(pol.to_dict()) == pol


def _folder(tmp_path, video_config: dict | None) -> str:
    from tests.helpers.hf import write_onevision_folder

    folder = write_onevision_folder(str(tmp_path / "ov"))
    if video_config is not None:
        (tmp_path / "ov/video_preprocessor_config.json").write_text(json.dumps(video_config))
    return folder


def test_the_family_reads_the_folders_video_config(tmp_path):
    from tests.helpers.hf import ONEVISION_TILE
    from vlmdata.text.families import load_family

    fam = load_family(_folder(tmp_path, {"video_processor_type": "LlavaOnevisionVideoProcessor", "num_frames": 4,
                                         "image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    assert fam.encodes_video and fam.video_token_id == fam.tokenizer.token_to_id("<video>")
    side = ONEVISION_TILE // 14
    assert make_video_policy(fam.vision.video_policy) == OnevisionVideoPolicy(num_frames=4, tile=ONEVISION_TILE,
                                                                              side=side)


@pytest.mark.parametrize("config,match", [({"fps": 1.0}, "samples by fps"),
                                          ({"num_frames": 4}, "image_mean"),       # CLIP's default, not 0.5
                                          ({"num_frames": 4, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
                                            "size": {"height": 56, "width": 56}}, "tile")])
def test_a_video_config_it_cannot_lay_out_skips_video_rows_counted(tmp_path, caplog, config, match):
    """The family still lays out images; it warns why, and a video row is counted as video_unsupported while the
    image row beside it is written."""
    from PIL import Image

    from vlmdata.ingest import ShardConfig, shard_dataset
    from vlmdata.text.families import load_family

    folder = _folder(tmp_path, config)
    with caplog.at_level("WARNING"):
        fam = load_family(folder)
    assert not fam.encodes_video and fam.vision.video_policy is None and fam.vision.image_token_id is not None
    assert match in caplog.text and "video_unsupported" in caplog.text
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw/c.mp4").write_bytes(make_clip(ClipSpec(frames=20)))
    Image.new("RGB", (40, 30), (9, 99, 199)).save(tmp_path / "raw/s.png")
    turns = [{"from": "human", "value": "what ?"}, {"from": "gpt", "value": "green"}]
    rows = [{"id": "v", "video": "c.mp4", "conversations": [dict(turns[0], value="<video>\nwhat ?"), turns[1]]},
            {"id": "i", "image": "s.png", "conversations": [dict(turns[0], value="<image>\nwhat ?"), turns[1]]}]
    (tmp_path / "raw/data.json").write_text(json.dumps(rows))
    m = shard_dataset(ShardConfig(inputs=[str(tmp_path / "raw/data.json")], output=str(tmp_path / "ds"),
                                  tokenizer=folder, workers=0))
    assert m.num_samples == 1 and m.stats["skipped"] == {"video_unsupported": 1}
    assert match in m.stats["examples"]["video_unsupported"]["detail"]      # the folder's cause, said per row
