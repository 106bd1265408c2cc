"""Videos sharded with a Qwen2-VL folder and loaded (issue 22 items 3-4): a LLaVA-Video JSON with clips made at
test time is written with one `<|video_pad|>` per clip; loaded, each placeholder is expanded to the policy's
tokens, grids and pixel rows are the policy's (decoded frames at the sampled indices, resized bicubic, Qwen's
patch layout), the planner's lengths (from planning.npz, before any decode) equal the built ones on both pack
paths, and a clip that no longer decodes costs only its sample (counted) while the epoch completes."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.helpers.models import qwen_folder_or_skip
from tests.video.qwen_video_corpus import (
    CLIPS_OF,
    VIDEO_CONFIG,
    assert_bucket_rows_are_fast_pack_samples,
    assert_planned_lengths_are_built,
    by_key,
    packs,
    qwen_video_folder,
    shard_corpus,
)
from vlmdata import VLMDataset
from vlmdata.formats import Manifest, SampleIndex
from vlmdata.video import VideoPolicy, flatten_video, probe_clip

VIDEO_PAD, IMAGE_PAD = 151656, 151655


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("qvideo")
    folder = qwen_video_folder(qwen_folder_or_skip(), str(root / "qwen2-vl"))
    return shard_corpus(str(root), folder), str(root)


def policy() -> VideoPolicy:
    size = VIDEO_CONFIG["size"]
    return VideoPolicy(fps=VIDEO_CONFIG["fps"], min_frames=VIDEO_CONFIG["min_frames"],
                       max_frames=VIDEO_CONFIG["max_frames"], min_pixels=size["shortest_edge"],
                       max_pixels=size["longest_edge"])


def test_the_manifest_and_stored_ids_hold_one_video_token_per_clip(dataset):
    ds_path, _ = dataset
    m = Manifest.load(ds_path)
    assert m.stats["samples"] == 6 and m.stats["videos"] == 5 and not m.stats["skipped"]
    assert m.tokenizer["special"]["video"] == VIDEO_PAD
    assert m.tokenizer["vision"]["video_policy"] == policy().to_dict()   # the folder's video processor config


def test_loaded_samples_expand_each_clip_to_the_policys_tokens_grid_and_pixels(dataset):
    ds_path, root = dataset
    got = by_key(packs(ds_path))
    assert set(got) == {"v_h264", "v_mix", "v_two", "v_long", "i_only", "t_only"}
    pol = policy()
    for key, clips in CLIPS_OF.items():
        s = got[key]
        infos = [probe_clip(open(os.path.join(root, "raw/clips", c), "rb").read()) for c in clips]
        want = [tuple(int(x) for x in pol.grid(i.frames, i.measured_fps, i.width, i.height)) for i in infos]
        assert [tuple(g) for g in s["grids"]] == want, key
        assert int((s["ids"] == VIDEO_PAD).sum()) == sum(t * h * w // 4 for t, h, w in want), key
        runs = np.flatnonzero(np.diff(np.concatenate([[0], (s["ids"] == VIDEO_PAD).astype(int), [0]])) == 1)
        assert len(runs) == len(clips), key                        # one contiguous run per clip
        np.testing.assert_allclose(s["spans"], [pol.second_per_grid(i.frames, i.measured_fps) for i in infos],
                                   rtol=1e-6)
    assert (got["v_mix"]["ids"] == IMAGE_PAD).sum() > 0 and not (got["i_only"]["ids"] == VIDEO_PAD).any()
    # pixels: the sampled frames of the full decode, resized bicubic, in the processor's patch layout
    import av
    from PIL import Image

    data = open(os.path.join(root, "raw/clips/h264.mp4"), "rb").read()
    info = probe_clip(data)
    with av.open(__import__("io").BytesIO(data)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    w, h = (int(x) for x in pol.frame_size(info.width, info.height))
    picked = [np.asarray(Image.fromarray(frames[i]).resize((w, h), Image.BICUBIC))
              for i in pol.frame_indices(info.frames, info.measured_fps)]
    assert np.array_equal(got["v_h264"]["rows"], flatten_video(picked, 14, 2, 2))


@pytest.mark.parametrize("max_tokens", [4096, 400])
def test_planned_lengths_equal_built_lengths(dataset, max_tokens):
    """The planner's count (text + image + video tokens, from planning.npz) is each sample's built length; at
    400 tokens the long clip's sample does not fit and is dropped by the plan, never cut inside its video."""
    assert_planned_lengths_are_built(dataset[0], max_tokens)


def test_the_per_sample_path_expands_videos_as_the_fast_path(dataset):
    """Bucket mode (the per-sample path, prepare_sample) gives every sample the ids of the pack fast path."""
    assert_bucket_rows_are_fast_pack_samples(dataset[0])


def test_a_clip_that_no_longer_decodes_costs_only_its_sample(dataset, tmp_path):
    """The clip bytes of one sample are overwritten in the shard (same size, the index still points at them):
    that sample is skipped and counted, every other sample is loaded and the epoch completes."""
    import shutil

    ds_path, _ = dataset
    bad = str(tmp_path / "ds")
    shutil.copytree(ds_path, bad)
    m = Manifest.load(bad)
    path = os.path.join(bad, m.shards[0].index)
    ix = SampleIndex.load(path)
    i = [k.decode() for k in ix.key].index("v_h264")
    v = ix.videos
    off, size = int(v.vid_offset[v.video_start[i]]), int(v.vid_size[v.video_start[i]])
    tar = os.path.join(bad, m.shards[0].name)
    with open(tar, "r+b") as f:
        f.seek(off)
        f.write(b"\0garbage" * (size // 8) + b"\0" * (size % 8))
    _restamp(bad, tar, path)
    batches = packs(bad)
    keys = [k for b in batches for k in b["sample_keys"]]
    skipped = sum((b["stats"].get("skipped") or {}).get(r, 0) for b in batches
                  for r in ("undecodable_video", "bad_video", "no_video_stream", "no_video_frames", "truncated_video"))
    assert sorted(keys) == sorted(["v_mix", "v_two", "v_long", "i_only", "t_only"])
    assert skipped == 1


def _restamp(root: str, tar: str, index: str) -> None:
    """Record the changed shard's size and CRC in its index and the manifest (as if it had been written so)."""
    import json
    import zlib

    raw = open(tar, "rb").read()
    crc = zlib.crc32(raw) & 0xFFFFFFFF
    SampleIndex.load(index).describes(len(raw), crc).save(index)
    with open(os.path.join(root, "manifest.json")) as f:
        manifest = json.load(f)
    manifest["shards"][0]["crc32"] = crc
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def test_max_patches_counts_video_patches(dataset):
    """A pack's vision patches (image rows + video rows) stay within max_patches: the samples are spread over
    more packs, and one whose clips alone exceed the budget is dropped (counted), never cut."""
    ds_path, _ = dataset
    one_pack = list(VLMDataset(ds_path, max_tokens=4096))
    total = sum(len(one_pack[0][k]) for k in ("pixel_values", "pixel_values_videos"))
    budget = total // 3
    keys, dropped, n_packs = [], 0, 0
    for b in VLMDataset(ds_path, max_tokens=4096, max_patches=budget):
        rows = sum(len(b[k]) for k in ("pixel_values", "pixel_values_videos") if k in b)
        assert rows <= budget
        keys += b["sample_keys"]
        dropped += (b["stats"].get("skipped") or {}).get("too_many_images", 0)
        n_packs += bool(b["sample_keys"])
    assert n_packs >= 2 and len(keys) + dropped == 6


def test_show_lists_each_clips_sampled_frame_times(dataset):
    """`vlmdata show` lists the frames the family's video policy samples from each clip (the loader's indices, as
    times at the clip's measured rate)."""
    from vlmdata.ingest import show_samples

    ds_path, root = dataset
    clip = CLIPS_OF["v_two"][1]
    info = probe_clip(open(os.path.join(root, "raw/clips", clip), "rb").read())
    report, missing = show_samples(ds_path, ["v_two"])
    want = policy().frame_indices(info.frames, info.measured_fps)
    assert not missing and len(want) >= 4
    times = ", ".join(f"{i / info.measured_fps:.2f}" for i in want[:4])
    assert f"sampled {len(want)} frames at {times}" in report
    got = json.loads(show_samples(ds_path, ["v_two"], as_json=True)[0])["samples"][0]["videos"][1]
    assert got["sampled_frames"] == [int(i) for i in want] and got["frames"] == info.frames
