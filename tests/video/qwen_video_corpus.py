"""A LLaVA-Video style corpus (clips made at test time, images, text) sharded with a Qwen2-VL or Qwen3-VL folder."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
from PIL import Image

from vlmdata import VLMDataset
from vlmdata.formats import Manifest, SampleIndex
from vlmdata.ingest import ShardConfig, shard_dataset
from vlmdata.plan import sample_lengths
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


CLIPS_OF = {"v_h264": ["h264.mp4"], "v_mix": ["vp9.webm"], "v_two": ["short.mkv", "vfr.mp4"], "v_long": ["long.mp4"]}


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


def shard_corpus(root: str, folder: str, extra_rows: list[dict] = (), only: set[str] | None = None) -> str:
    """Write the clips, an image and the JSON under `root`/raw and shard it with `folder` (`only`: those rows'
    ids); returns the dataset."""
    os.makedirs(f"{root}/raw/clips", exist_ok=True)
    for name, spec in CLIPS.items():
        with open(f"{root}/raw/clips/{name}", "wb") as f:
            f.write(make_clip(spec))
    Image.new("RGB", (100, 80), (20, 140, 30)).save(f"{root}/raw/still.png")
    with open(f"{root}/raw/data.json", "w") as f:
        json.dump([r for r in rows() if only is None or r["id"] in only] + list(extra_rows), f)
    shard_dataset(ShardConfig(inputs=[f"{root}/raw/data.json"], output=f"{root}/ds", tokenizer=folder, workers=0))
    return f"{root}/ds"


def packs(ds_path: str, **kw) -> list[dict]:
    return list(VLMDataset(ds_path, max_tokens=kw.pop("max_tokens", 4096), **kw))


def by_key(batches: list[dict]) -> dict[str, dict]:
    """Per sample: its ids and its clips' grids / rows, from the packs."""
    out = {}
    for b in batches:
        cu = b["cu_seqlens"].tolist()
        grids = b["video_grid"].tolist() if "video_grid" in b else []
        rows = b["pixel_values_videos"].numpy() if "pixel_values_videos" in b else None
        spans = b["second_per_grid_ts"].tolist() if "second_per_grid_ts" in b else []
        v = at = 0
        for i, key in enumerate(b["sample_keys"]):
            ids = b["input_ids"][cu[i]:cu[i + 1]].numpy()
            n = len(CLIPS_OF.get(key, []))
            mine = grids[v:v + n]
            size = sum(t * h * w for t, h, w in mine)
            out[key] = {"ids": ids, "grids": mine, "spans": spans[v:v + n],
                        "rows": rows[at:at + size] if rows is not None else None}
            v, at = v + n, at + size
    return out


def assert_planned_lengths_are_built(ds_path: str, max_tokens: int) -> None:
    """The planner's count (text + image + video tokens, from planning.npz) is each sample's built length; a
    sample over max_tokens is dropped by the plan, never cut inside its video."""
    ds = VLMDataset(ds_path, max_tokens=max_tokens)
    cols = ds.sources[0].planning.load()
    assert "video_tokens" in cols and int(cols["video_tokens"].sum()) > 0
    m = Manifest.load(ds_path)
    keys = [k.decode() for s in m.shards for k in SampleIndex.load(os.path.join(ds_path, s.index)).key]
    planned = dict(zip(keys, sample_lengths(cols, np.arange(len(keys)), ds.policy)[0].tolist()))
    built = {}
    for b in ds:
        cu = b["cu_seqlens"].tolist()
        assert cu[-1] <= max_tokens
        built.update({k: cu[i + 1] - cu[i] for i, k in enumerate(b["sample_keys"])})
        assert b["stats"]["truncated"] == 0
    assert built == {k: v for k, v in planned.items() if v <= max_tokens}
    assert len(built) == (6 if max_tokens == 4096 else sum(v <= max_tokens for v in planned.values()))


def assert_bucket_rows_are_fast_pack_samples(ds_path: str) -> None:
    """Bucket mode (the per-sample path, prepare_sample) gives every sample the ids of the pack fast path."""
    fast = by_key(packs(ds_path))
    from vlmdata.loading import DatasetOptions

    for b in VLMDataset(ds_path, max_tokens=4096, options=DatasetOptions(mode="bucket")):
        for i, key in enumerate(b["sample_keys"]):
            n = int(b["lengths"][i])
            assert np.array_equal(b["input_ids"][i, :n].numpy(), fast[key]["ids"]), key
