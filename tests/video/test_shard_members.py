"""Clips in shards: each clip's tar member is the source file byte for byte (its extension kept), its probe is
stored beside it and in the index's video columns equal to `probe_clip`'s, indices without clips read as
before, and `vlmdata show` / `vlmdata inspect` report the clips of a dataset holding them."""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from tests.helpers.models import qwen_folder_or_skip
from vlmdata.formats import EncodedImage, Manifest, SampleIndex, WdsPartWriter, read_sample
from vlmdata.ingest import (
    RetokenizeConfig,
    VideoOptions,
    prepare_video,
    retokenize_dataset,
    write_dataset_tables,
)
from vlmdata.testing import ClipSpec, make_clip
from vlmdata.text import ByteTokenizer, encode_conversation
from vlmdata.video import ClipInfo, probe_clip

CLIPS = {"h264.mp4": ClipSpec(), "vp9.webm": ClipSpec(container="webm", codec="libvpx-vp9", fps=25, frames=50),
         "mpeg4.mkv": ClipSpec(container="mkv", codec="mpeg4", width=128, height=72),
         "rot90.mov": ClipSpec(container="mov", rotation=90, frames=30, gop=5),
         "vfr.mp4": ClipSpec(variable_rate=True, frames=40, fps=24)}
TOK = ByteTokenizer()
VIDEO_ID = TOK.vocab_size          # the placeholder id the writer is told a video stands for (one per clip)


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


def _tokens(n_images: int, n_videos: int, answer: str) -> np.ndarray:
    text = encode_conversation(TOK, [("user", "<image>" * n_images + " what happens?"), ("assistant", answer)],
                               n_images)
    videos = np.asarray([[VIDEO_ID] * n_videos, [0] * n_videos], dtype=np.int32)
    return np.concatenate([text[:, :1], videos, text[:, 1:]], axis=1)


def _record(key: str, n_images: int, clips: list[str]) -> dict:
    """The sample's source record: a LLaVA-Video row naming its image and clips."""
    row = {"id": key, "conversations": [{"from": "human", "value": "<image>" * n_images + "<video>" * len(clips)
                                         + " what happens?"}, {"from": "gpt", "value": f"clips {clips}"}]}
    return row | ({"image": "still.png"} if n_images else {}) | ({"videos": clips} if clips else {})


@pytest.fixture(scope="module")
def clips() -> dict[str, bytes]:
    return {name: make_clip(spec) for name, spec in CLIPS.items()}


def _write(root, clips: dict[str, bytes]) -> tuple[list, dict[str, list[str]]]:
    """One shard: a sample per clip, one with two clips and an image, and one image-only sample."""
    w = WdsPartWriter(str(root), "shard-000000-00", TOK.special.image, fsync=False, video_token_id=VIDEO_ID)
    png = EncodedImage(_png(), "png", 40, 30)
    samples = {f"s{i}": [name] for i, name in enumerate(clips)}
    samples["pair"] = ["vp9.webm", "rot90.mov"]
    samples["still"] = []
    for key, names in samples.items():
        videos = [prepare_video(clips[n], n, VideoOptions()) for n in names]
        images = [png] if key in ("pair", "still") else []
        w.add(key, _record(key, len(images), names), _tokens(len(images), len(videos), f"clips {names}"), images,
              videos)
    return [w.close()], samples


def test_clip_members_are_the_source_bytes_beside_their_probe(tmp_path, clips):
    shards, samples = _write(tmp_path, clips)
    with tarfile.open(tmp_path / shards[0].name) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    for key, names in samples.items():
        for j, name in enumerate(names):
            ext = name.rsplit(".", 1)[1]
            assert members[f"{key}.v{j}.{ext}"] == clips[name]           # kept as it is, extension and all
            stored = json.loads(members[f"{key}.v{j}.clip.json"])
            assert stored == probe_clip(clips[name]).to_dict()
    assert not any(".v" in m for m in members if m.startswith("still."))


def test_index_video_columns_equal_the_probe_and_samples_read_back(tmp_path, clips):
    shards, samples = _write(tmp_path, clips)
    ix = SampleIndex.load(str(tmp_path / shards[0].index))
    assert ix.videos.n_videos.tolist() == [len(n) for n in samples.values()]
    buf = (tmp_path / shards[0].name).read_bytes()
    for i, (key, names) in enumerate(samples.items()):
        assert ix.key[i].decode() == key
        sl = ix.videos.video_slice(i)
        infos = [probe_clip(clips[n]) for n in names]
        assert ix.videos.vid_width[sl].tolist() == [x.width for x in infos]
        assert ix.videos.vid_height[sl].tolist() == [x.height for x in infos]
        assert ix.videos.vid_rotation[sl].tolist() == [x.rotation for x in infos]
        assert ix.videos.vid_frames[sl].tolist() == [x.frames for x in infos]
        assert ix.videos.vid_duration[sl].tolist() == [x.duration_s for x in infos]
        assert ix.videos.vid_fps[sl].tolist() == [x.measured_fps for x in infos]
        rec = read_sample(buf, ix, i)
        assert [bytes(v.data) for v in rec.videos] == [clips[n] for n in names]
        for v, want in zip(rec.videos, infos):
            back = ClipInfo.from_dict(v.info)
            assert (back.codec, back.frames, back.keyframes.tolist(), back.frame_pts.tolist()) == \
                (want.codec, want.frames, want.keyframes.tolist(), want.frame_pts.tolist())
        assert int(ix.text_tokens[i]) == rec.tokens.shape[1] - len(rec.images) - len(names)


def test_indices_without_clips_are_written_and_read_as_before(tmp_path):
    w = WdsPartWriter(str(tmp_path), "shard-000000-00", TOK.special.image, fsync=False)
    w.add("a", {"id": "a"}, _tokens(1, 0, "red"), [EncodedImage(_png(), "png", 40, 30)])
    info = w.close()
    data = (tmp_path / info.index).read_bytes()
    with np.load(tmp_path / info.index) as z:
        assert not any(name.startswith(("vid_", "n_videos", "video_start")) for name in z.files)
    ix = SampleIndex.from_bytes(data)
    assert ix.videos.n_videos.tolist() == [0] and ix.videos.total == 0
    assert read_sample((tmp_path / info.name).read_bytes(), ix, 0).videos == []


def test_a_video_without_its_placeholder_is_refused(tmp_path, clips):
    w = WdsPartWriter(str(tmp_path), "shard-000000-00", TOK.special.image, fsync=False, video_token_id=VIDEO_ID)
    clip = prepare_video(clips["h264.mp4"], "h264.mp4", VideoOptions())
    with pytest.raises(ValueError, match="0 video placeholders for 1 videos"):
        w.add("a", {"id": "a"}, _tokens(0, 0, "x"), [], [clip])
    w.abort()


def _dataset(root, clips) -> dict[str, list[str]]:
    shards, samples = _write(root, clips)
    write_dataset_tables(str(root), shards, fsync=False)
    n_videos = sum(len(v) for v in samples.values())
    Manifest(kind="webdataset", shards=shards, tokenizer=TOK.identity(),
             stats={"samples": len(samples), "videos": n_videos}).save(str(root))
    return samples


def test_show_lists_a_samples_clips_and_writes_them(tmp_path, clips):
    _dataset(tmp_path / "ds", clips)
    r = subprocess.run([sys.executable, "-m", "vlmdata", "show", str(tmp_path / "ds"), "pair", "--images",
                        str(tmp_path / "files")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    vp9, mov = probe_clip(clips["vp9.webm"]), probe_clip(clips["rot90.mov"])
    assert f"video 0   webm vp9 96x64, rotation 0, {vp9.duration_s:.2f} s, 25 fps declared" in r.stdout
    assert f"video 1   mov h264 96x64, rotation 90, {mov.duration_s:.2f} s, 30 fps declared" in r.stdout
    assert f"{mov.frames} frames, {len(mov.keyframes)} keyframes, {len(clips['rot90.mov'])} bytes" in r.stdout
    assert "1 image placeholders, 2 video placeholders" in r.stdout
    assert (tmp_path / "files" / "pair.v0.webm").read_bytes() == clips["vp9.webm"]
    assert (tmp_path / "files" / "pair.v1.mov").read_bytes() == clips["rot90.mov"]
    r = subprocess.run([sys.executable, "-m", "vlmdata", "show", str(tmp_path / "ds"), "s4", "--json"],
                       capture_output=True, text=True)
    got = json.loads(r.stdout)["samples"][0]["videos"]
    vfr = probe_clip(clips["vfr.mp4"])
    assert len(got) == 1 and got[0]["variable_rate"] is True and got[0]["frames"] == vfr.frames
    assert got[0]["measured_fps"] == vfr.measured_fps and got[0]["ext"] == "mp4"


def test_inspect_reports_clip_counts_and_durations(tmp_path, clips):
    samples = _dataset(tmp_path / "ds", clips)
    r = subprocess.run([sys.executable, "-m", "vlmdata", "inspect", str(tmp_path / "ds")], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    durations = [probe_clip(clips[n]).duration_s for names in samples.values() for n in names]
    assert (f"videos: {len(durations)} clips in {sum(1 for v in samples.values() if v)} samples, "
            f"{sum(durations):.1f} s in all (shortest {min(durations):.2f} s, longest {max(durations):.2f} s)") \
        in r.stdout
    lines = r.stdout.split("video duration (seconds)\n", 1)[1].splitlines()
    counts = {line.split()[0] + " " + line.split()[1]: int(line.split()[3]) for line in lines[:2]}
    assert counts == {"[0, 5)": len(durations), "[5, 10)": 0}


def test_retokenize_gives_clips_no_tokens_without_a_video_policy(tmp_path, clips):
    samples = _dataset(tmp_path / "ds", clips)
    result = retokenize_dataset(RetokenizeConfig(dataset=str(tmp_path / "ds"), tokenizer=str(qwen_folder_or_skip()),
                                                 view="qwen", workers=0))
    with_clips = sum(1 for v in samples.values() if v)
    assert result.skipped == {"video_unsupported": with_clips}
    assert result.encoded == len(samples) - with_clips == 1
    assert "the qwen2_vl model family has no video policy yet" in result.examples["video_unsupported"]["detail"]
