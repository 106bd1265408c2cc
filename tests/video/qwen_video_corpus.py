"""A LLaVA-Video style corpus (clips made at test time, images, text) sharded with a Qwen2-VL or Qwen3-VL folder."""
from __future__ import annotations

import json
import os
import shutil

from PIL import Image

from vlmdata.ingest import ShardConfig, shard_dataset
from vlmdata.testing import ClipSpec, make_clip

CLIPS = {"h264.mp4": ClipSpec(frames=60, fps=30),
         "vp9.webm": ClipSpec(container="webm", codec="libvpx-vp9", fps=25, frames=100, width=128, height=72),
         "short.mkv": ClipSpec(container="mkv", codec="mpeg4", frames=3, fps=10, width=80, height=80),
         "vfr.mp4": ClipSpec(variable_rate=True, frames=40, fps=24),
         "long.mp4": ClipSpec(frames=300, fps=30, width=64, height=48, gop=30)}
# the tiny video processor: small frames so the tiny models run fast (read from video_preprocessor_config.json)
VIDEO_CONFIG = {"fps": 3.0, "min_frames": 2, "max_frames": 12, "temporal_patch_size": 2, "patch_size": 14,
                "merge_size": 2, "size": {"shortest_edge": 56 * 56, "longest_edge": 112 * 112}}
# Qwen3-VL's (patch 16; its longest_edge bounds the pixels of all sampled frames together; min_frames default 4)
QWEN3_VIDEO_CONFIG = {"fps": 3.0, "max_frames": 12, "temporal_patch_size": 2, "patch_size": 16, "merge_size": 2,
                      "size": {"shortest_edge": 64 * 64, "longest_edge": 6 * 128 * 128}}


def _turns(question: str, answer: str) -> list[dict]:
    return [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]


def rows() -> list[dict]:
    """Video-only, video + image, two videos, image-only and text-only rows (LLaVA-Video layout)."""
    return [
        {"id": "v_h264", "video": "clips/h264.mp4", "conversations": _turns("<video>\nWhat happens?", "A dog runs.")},
        {"id": "v_mix", "video": "clips/vp9.webm", "image": "still.png",
         "conversations": _turns("<image>\nThis frame and <video> the clip: same?", "Yes, the same scene.")},
        {"id": "v_two", "videos": ["clips/short.mkv", "clips/vfr.mp4"],
         "conversations": _turns("<video><video>\nCompare them.", "The second is longer.")},
        {"id": "v_long", "video": "clips/long.mp4", "conversations": _turns("<video>\nDescribe it.", "Stripes move.")},
        {"id": "i_only", "image": "still.png", "conversations": _turns("<image>\nWhat colour?", "Green.")},
        {"id": "t_only", "conversations": _turns("Say hi.", "Hi.")},
    ]


def qwen_video_folder(base, out: str, config: dict = VIDEO_CONFIG, kind: str = "Qwen2VLVideoProcessor") -> str:
    """A copy of the Qwen processor folder `base` with a tiny video processor config."""
    shutil.copytree(base, out)
    with open(os.path.join(out, "video_preprocessor_config.json"), "w") as f:
        json.dump({"video_processor_type": kind, **config}, f)
    return out


def shard_corpus(root: str, folder: str, extra_rows: list[dict] = ()) -> str:
    """Write the clips, an image and the JSON under `root`/raw and shard it with `folder`; returns the dataset."""
    os.makedirs(f"{root}/raw/clips", exist_ok=True)
    for name, spec in CLIPS.items():
        with open(f"{root}/raw/clips/{name}", "wb") as f:
            f.write(make_clip(spec))
    Image.new("RGB", (100, 80), (20, 140, 30)).save(f"{root}/raw/still.png")
    with open(f"{root}/raw/data.json", "w") as f:
        json.dump(rows() + list(extra_rows), f)
    shard_dataset(ShardConfig(inputs=[f"{root}/raw/data.json"], output=f"{root}/ds", tokenizer=folder, workers=0))
    return f"{root}/ds"
