"""Frame lists (issue 22 item 1): a row whose video is a list of image files is sharded as one video (the files as
they are in a `K.v0.frames.tar` member, a clip's metadata from their headers) and loaded as a clip: a Qwen2-VL
sample built from a clip's decoded frames saved as PNGs equals the clip's own sample (ids, grid, pixel rows,
seconds per patch), planned like it; bad lists are counted under their reasons and nothing else is lost."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from PIL import Image

from tests.helpers.models import qwen3_folder_or_skip, qwen_folder_or_skip
from tests.video.qwen_video_corpus import QWEN3_VIDEO_CONFIG, VIDEO_CONFIG, qwen_video_folder
from vlmdata import VLMDataset
from vlmdata.formats import Manifest, SampleIndex, read_sample
from vlmdata.ingest import DEFAULT_FRAME_LIST_FPS, ShardConfig, shard_dataset
from vlmdata.testing import ClipSpec, make_clip
from vlmdata.video import VideoPolicy, frame_list_info, probe_clip

N = 20
VIDEO_PAD = 151656
QUESTION, ANSWER = "<video>\nWhat happens?", "Stripes move."


def _row(key: str, video, **extra) -> dict:
    return {"id": key, "video": video, **extra, "conversations": [
        {"from": "human", "value": QUESTION}, {"from": "gpt", "value": ANSWER}]}


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """A clip, its decoded frames as PNG files, and rows naming them (good and bad)."""
    import av

    root = tmp_path_factory.mktemp("frames")
    raw = root / "raw"
    (raw / "frames").mkdir(parents=True)
    clip = make_clip(ClipSpec(frames=N, fps=10, width=96, height=64))
    (raw / "clip.mp4").write_bytes(clip)
    with av.open(io.BytesIO(clip)) as c:
        decoded = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    paths = []
    for i, frame in enumerate(decoded):
        Image.fromarray(frame).save(raw / "frames" / f"{i:03d}.png")
        paths.append(f"frames/{i:03d}.png")
    Image.new("RGB", (64, 48)).save(raw / "frames" / "small.png")
    good = (raw / "frames" / "000.png").read_bytes()
    (raw / "frames" / "cut.png").write_bytes(good[:len(good) // 2])       # header intact, body cut short
    (raw / "frames" / "junk.png").write_bytes(b"not an image at all")
    fps = probe_clip(clip).measured_fps
    rows = [_row("clip", "clip.mp4"), _row("listed", paths, fps=fps),
            _row("object", {"frames": paths, "fps": fps}), _row("default_rate", paths[:8]),
            _row("mixed", paths[:3] + ["frames/small.png"], fps=fps), _row("empty", {"frames": []}),
            _row("missing", paths[:3] + ["frames/gone.png"], fps=fps),
            _row("junk", paths[:3] + ["frames/junk.png"], fps=fps), _row("cut", ["frames/cut.png"] + paths[1:], fps=fps)]
    return {"root": root, "raw": raw, "rows": rows, "paths": paths, "fps": fps}


def _shard(raw: dict, name: str, folder: str, keys: set[str] | None = None) -> str:
    data = raw["raw"] / f"{name}.json"
    data.write_text(json.dumps([r for r in raw["rows"] if keys is None or r["id"] in keys]))
    out = str(raw["root"] / name)
    shard_dataset(ShardConfig(inputs=[str(data)], output=out, tokenizer=folder, workers=0))
    return out


@pytest.fixture(scope="module")
def corpus(raw):
    """All rows sharded for Qwen2-VL."""
    folder = qwen_video_folder(qwen_folder_or_skip(), str(raw["root"] / "qwen2-vl"))
    return raw | {"ds": _shard(raw, "qwen2", folder)}


def _policy() -> VideoPolicy:
    size = VIDEO_CONFIG["size"]
    return VideoPolicy(fps=VIDEO_CONFIG["fps"], min_frames=VIDEO_CONFIG["min_frames"],
                       max_frames=VIDEO_CONFIG["max_frames"], min_pixels=size["shortest_edge"],
                       max_pixels=size["longest_edge"])


def _stored(ds: str) -> tuple[SampleIndex, bytes, list[str]]:
    m = Manifest.load(ds)
    ix = SampleIndex.load(os.path.join(ds, m.shards[0].index))
    return ix, open(os.path.join(ds, m.shards[0].name), "rb").read(), [k.decode() for k in ix.key]


def test_bad_frame_lists_are_counted_and_nothing_else_is_lost(corpus):
    m = Manifest.load(corpus["ds"])
    assert m.stats["skipped"] == {"mixed_frame_sizes": 1, "no_video_frames": 1, "missing_file": 1,
                                  "not_an_image": 1}
    assert m.stats["samples"] == 5 and m.stats["videos"] == 5
    assert "frame 3 of 4 is 64x48, frame 0 is 96x64" in m.stats["examples"]["mixed_frame_sizes"]["detail"]
    assert "frame 3 of 4 (frames/gone.png)" in m.stats["examples"]["missing_file"]["detail"]


def test_the_member_holds_the_frame_files_as_they_are_with_a_clips_metadata(corpus):
    ix, buf, keys = _stored(corpus["ds"])
    paths, fps = corpus["paths"], corpus["fps"]
    for key, n, rate in (("listed", N, fps), ("object", N, fps), ("default_rate", 8, DEFAULT_FRAME_LIST_FPS)):
        i = keys.index(key)
        (video,) = read_sample(buf, ix, i).videos
        with tarfile.open(fileobj=io.BytesIO(bytes(video.data))) as tar:
            members = tar.getmembers()
            assert [m.name for m in members] == [f"{j:06d}.png" for j in range(n)]
            assert [tar.extractfile(m).read() for m in members] == \
                [(corpus["raw"] / p).read_bytes() for p in paths[:n]]
        assert video.info == frame_list_info(n, 96, 64, rate).to_dict()
        sl = ix.videos.video_slice(i)
        assert (ix.videos.vid_frames[sl].tolist(), ix.videos.vid_fps[sl].tolist()) == ([n], [rate])
        assert (ix.videos.vid_width[sl].tolist(), ix.videos.vid_height[sl].tolist()) == ([96], [64])


def _samples(ds: str) -> tuple[dict[str, dict], dict]:
    out, skipped = {}, {}
    for b in VLMDataset(ds, max_tokens=4096):
        cu = b["cu_seqlens"].tolist()
        for r, c in (b["stats"].get("skipped") or {}).items():
            skipped[r] = skipped.get(r, 0) + c
        grids, at = b["video_grid"].tolist(), 0
        for i, key in enumerate(b["sample_keys"]):
            size = int(np.prod(grids[i]))
            out[key] = {"ids": b["input_ids"][cu[i]:cu[i + 1]].numpy(), "grid": grids[i],
                        "span": float(b["second_per_grid_ts"][i]),
                        "rows": b["pixel_values_videos"][at:at + size].numpy()}
            at += size
    return out, skipped


def test_a_frame_list_loads_as_the_clip_its_frames_came_from(corpus):
    got, skipped = _samples(corpus["ds"])
    assert set(got) == {"clip", "listed", "object", "default_rate"}
    assert skipped == {"undecodable_video": 1}          # the frame cut short: counted at load, the epoch completes
    pol, clip = _policy(), got["clip"]
    assert clip["grid"] == [int(x) for x in pol.grid(N, corpus["fps"], 96, 64)]
    for key in ("listed", "object"):
        assert np.array_equal(got[key]["ids"], clip["ids"]) and got[key]["grid"] == clip["grid"], key
        assert np.array_equal(got[key]["rows"], clip["rows"]) and got[key]["span"] == clip["span"], key
    assert got["default_rate"]["grid"] == [int(x) for x in pol.grid(8, DEFAULT_FRAME_LIST_FPS, 96, 64)]
    ds = VLMDataset(corpus["ds"], max_tokens=4096)
    tokens = dict(zip(_stored(corpus["ds"])[2], ds.sources[0].planning.load()["video_tokens"].tolist()))
    assert tokens["listed"] == tokens["clip"] == int(pol.tokens(N, corpus["fps"], 96, 64))


def test_show_and_inspect_report_a_frame_list_like_a_clip(corpus):
    r = subprocess.run([sys.executable, "-m", "vlmdata", "show", corpus["ds"], "listed"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert f"video 0   frames.tar frames 96x64, rotation 0, {N / corpus['fps']:.2f} s" in r.stdout
    assert f"{N} frames, {N} keyframes" in r.stdout
    r = subprocess.run([sys.executable, "-m", "vlmdata", "inspect", corpus["ds"], "--samples", "0"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "videos: 5 clips in 5 samples" in r.stdout


def test_a_qwen3_vl_frame_list_loads_as_its_clip_timestamps_included(raw):
    folder = qwen_video_folder(qwen3_folder_or_skip(), str(raw["root"] / "qwen3-vl"), QWEN3_VIDEO_CONFIG,
                               "Qwen3VLVideoProcessor")
    got, skipped = _samples(_shard(raw, "qwen3", folder, {"clip", "listed"}))
    assert set(got) == {"clip", "listed"} and not skipped
    t, h, w = got["clip"]["grid"]
    assert int((got["clip"]["ids"] == VIDEO_PAD).sum()) == t * h * w // 4 > 0 and t >= 2   # one stamp per patch
    for part in ("ids", "rows"):
        assert np.array_equal(got["listed"][part], got["clip"][part]), part
    assert got["listed"]["grid"] == got["clip"]["grid"]
