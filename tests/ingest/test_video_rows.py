"""Rows that carry videos: every input layout parses them into the conversation's video items; at shard time
each clip is probed (a hostile clip is counted under its probe's reason), and a model family without a video
policy skips the row as `video_unsupported`, never training it as text; no other row is lost."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.corpus import generate_corpus
from tests.helpers.models import qwen_folder_or_skip
from tests.helpers.shards import read_jsonl, shard, stored_members
from vlmdata.errors import ConfigError, RowProblem, TooManySkipsError
from vlmdata.ingest import ColumnSpec, FrameList, check_text, normalize
from vlmdata.testing import ClipSpec, make_clip

QUESTION = "What happens in the video?"
VIDEO, IMAGE = {"type": "video"}, {"type": "image"}


def _text(t: str) -> dict:
    return {"type": "text", "text": t}


def _conv(row: dict):
    sample = normalize(row, row.get("id", "r"), ColumnSpec(), native=True)
    return sample, sample.to_conversation()


def test_llava_video_rows_place_clips_at_their_markers():
    sample, conv = _conv({"id": "a", "video": "clip.mp4", "conversations": [
        {"from": "human", "value": f"<video>\n{QUESTION}"}, {"from": "gpt", "value": "A dog runs."}]})
    assert sample.videos == ["clip.mp4"] and sample.images == []
    assert (conv.n_videos, conv.n_images) == (1, 0)
    assert conv.messages == [{"role": "user", "content": [VIDEO, _text(f"\n{QUESTION}")]},
                             {"role": "assistant", "content": [_text("A dog runs.")]}]


def test_a_row_mixing_images_and_videos_keeps_both_orders():
    sample, conv = _conv({"id": "m", "image": "x.jpg", "videos": ["a.mp4", "b.webm"], "conversations": [
        {"from": "human", "value": "<image> then <video> and <video>?"}, {"from": "gpt", "value": "Yes."}]})
    assert sample.images == ["x.jpg"] and sample.videos == ["a.mp4", "b.webm"]
    assert conv.messages[0]["content"] == [IMAGE, _text(" then "), VIDEO, _text(" and "), VIDEO, _text("?")]
    assert (conv.n_images, conv.n_videos) == (1, 2)


def test_videos_without_markers_open_the_first_user_turn():
    _, conv = _conv({"id": "c", "videos": ["a.mp4"], "image": "x.jpg", "conversations": [
        {"from": "human", "value": QUESTION}, {"from": "gpt", "value": "A dog."}]})
    assert conv.messages[0]["content"] == [VIDEO, IMAGE, _text(QUESTION)]


def test_openai_messages_with_video_items():
    sample, conv = _conv({"id": "o", "videos": ["row.mkv"], "messages": [
        {"role": "user", "content": [{"type": "video", "video": "a.mp4"}, {"type": "image", "image": "x.png"},
                                     {"type": "video_url", "video_url": {"url": "b.mov"}}, {"type": "video"},
                                     _text(QUESTION)]},
        {"role": "assistant", "content": "Three clips."}]})
    assert sample.videos == ["a.mp4", "b.mov", "row.mkv"] and sample.images == ["x.png"]
    assert conv.messages[0]["content"] == [VIDEO, IMAGE, VIDEO, VIDEO, _text(QUESTION)]
    assert (conv.n_images, conv.n_videos) == (1, 3)


def test_string_messages_take_the_row_videos_at_markers():
    sample, conv = _conv({"id": "s", "video": "a.mp4", "messages": [
        {"role": "user", "content": f"{QUESTION} <video>"}, {"role": "assistant", "content": "A dog."}]})
    assert sample.videos == ["a.mp4"]
    assert conv.messages[0]["content"] == [_text(f"{QUESTION} "), VIDEO] and conv.n_videos == 1


def test_caption_rows_with_a_video_column():
    sample, conv = _conv({"id": "cap", "video": "a.webm", "caption": "a dog runs"})
    assert sample.videos == ["a.webm"] and sample.images == []
    assert conv.messages == [{"role": "user", "content": [VIDEO]},
                             {"role": "assistant", "content": [_text("a dog runs")]}]


def test_frame_lists_stand_for_one_video_with_their_rate():
    frames = [f"frames/{i:03d}.jpg" for i in range(4)]
    sample, conv = _conv({"id": "f", "video": frames, "fps": 2, "conversations": [
        {"from": "human", "value": f"<video>{QUESTION}"}, {"from": "gpt", "value": "A dog."}]})
    assert sample.videos == [FrameList(tuple(frames), 2.0)] and conv.n_videos == 1
    sample, _ = _conv({"id": "g", "messages": [
        {"role": "user", "content": [{"type": "video", "video": frames, "sample_fps": 1}, _text(QUESTION)]},
        {"role": "assistant", "content": "A dog."}]})
    assert sample.videos == [FrameList(tuple(frames), 1.0)]
    sample, _ = _conv({"id": "h", "videos": [{"frames": ["a", "b"], "fps": 4}, {"frames": frames}], "fps": 3,
                       "conversations": [{"from": "human", "value": f"<video><video>{QUESTION}"},
                                         {"from": "gpt", "value": "Two."}]})
    assert sample.videos == [FrameList(("a", "b"), 4.0), FrameList(tuple(frames), 3.0)]


@pytest.mark.parametrize("video, reason", [({"frames": []}, "no_video_frames"), ([], "no_video_frames"),
                                           ({"frames": [3]}, "bad_image_ref"), ({"frames": ["a.png"], "fps": -1},
                                                                                "bad_text")])
def test_bad_frame_lists_are_counted_under_their_reason(video, reason):
    with pytest.raises(RowProblem) as err:
        _conv({"id": "e", "video": video, "fps": 2, "conversations": [
            {"from": "human", "value": f"<video>{QUESTION}"}, {"from": "gpt", "value": "A dog."}]})
    assert err.value.reason == reason


def test_an_empty_video_column_beside_a_rate_names_no_video_without_a_marker():
    sample, conv = _conv({"id": "t", "video": [], "fps": 2, "conversations": [
        {"from": "human", "value": QUESTION}, {"from": "gpt", "value": "No video here."}]})
    assert sample.videos == [] and conv.n_videos == 0


@pytest.mark.parametrize("row, reason", [
    ({"video": "a.mp4", "conversations": [{"from": "human", "value": "<video><video>?"},
                                          {"from": "gpt", "value": "x"}]}, "marker_mismatch"),
    ({"conversations": [{"from": "human", "value": "<video>?"}, {"from": "gpt", "value": "x"}]}, "video_unsupported"),
    ({"messages": [{"role": "user", "content": [{"type": "video"}, _text("?")]},
                   {"role": "assistant", "content": "x"}]}, "marker_mismatch"),
    ({"videos": ["a.mp4", "b.mp4"], "messages": [{"role": "user", "content": [{"type": "video"}, _text("?")]},
                                                {"role": "assistant", "content": "x"}]}, "marker_mismatch"),
    ({"texts": [{"user": "<video> what?", "assistant": "x"}], "images": []}, "video_unsupported"),
    ({"image": "clip.mp4", "caption": "a dog"}, "video_unsupported"),
    ({"video": 7, "caption": "a dog"}, "bad_image_ref"),
])
def test_videos_that_cannot_be_placed_are_counted_reasons(row, reason):
    with pytest.raises(RowProblem) as err:
        sample = normalize({"id": "bad", **row}, "bad", ColumnSpec(), native=True)
        check_text(sample)
    assert err.value.reason == reason, str(err.value)


GOOD_CLIPS = {"h264.mp4": ClipSpec(), "vp9.webm": ClipSpec(container="webm", codec="libvpx-vp9", fps=25, frames=50),
              "mpeg4.mkv": ClipSpec(container="mkv", codec="mpeg4", width=128, height=72),
              "rot90.mov": ClipSpec(container="mov", rotation=90, frames=30),
              "vfr.mp4": ClipSpec(variable_rate=True, frames=40)}


def _hostile_clips() -> dict[str, tuple[bytes, str]]:
    streamed = make_clip(ClipSpec(frames=110, faststart=True))
    plain = make_clip(ClipSpec(frames=60))
    return {"empty.mp4": (b"", "empty_file"),
            "audio.mp4": (make_clip(ClipSpec(video=False)), "no_video_stream"),
            "noframes.mkv": (make_clip(ClipSpec(frames=0, audio=True, container="mkv")), "no_video_frames"),
            "cutindex.mp4": (plain[: len(plain) * 6 // 10], "bad_video"),
            "lying.mp4": (streamed[: len(streamed) // 3], "truncated_video"),   # its index claims 3.7 s
            "long.mp4": (make_clip(ClipSpec(frames=150)), "video_too_long"),    # 5 s > --max-video-seconds 4
            "large.mp4": (make_clip(ClipSpec(width=320, height=240, frames=10)), "video_too_large")}


def _video_row(i: int, clip: str) -> dict:
    return {"id": f"v-{i}-{clip.replace('.', '_')}", "video": f"clips/{clip}", "conversations": [
        {"from": "human", "value": f"<video>\n{QUESTION}"}, {"from": "gpt", "value": f"Clip {clip}."}]}


def _corpus(tmp_path):
    corpus = generate_corpus(tmp_path / "corpus", 8, seed=5, fmt="llava")
    (corpus / "clips").mkdir()
    for name, spec in GOOD_CLIPS.items():
        (corpus / "clips" / name).write_bytes(make_clip(spec))
    hostile = _hostile_clips()
    for name, (data, _) in hostile.items():
        (corpus / "clips" / name).write_bytes(data)
    rows = read_jsonl(corpus / "data.jsonl")
    videos = [_video_row(i, c) for i, c in enumerate([*GOOD_CLIPS, *hostile])]
    mixed = {"id": "v-mixed", "image": rows[0]["images"][0], "video": "clips/h264.mp4",
             "conversations": [{"from": "human", "value": "<image> and <video>: the same dog?"},
                               {"from": "gpt", "value": "Yes."}]}
    prose = {**rows[0], "id": "prose", "video": None, "videos": [], "conversations": [   # empty video columns
        {"from": "human", "value": "<image>\nIs this a frame of a video about videos?"},
        {"from": "gpt", "value": "Yes, a video still."}]}
    (corpus / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + [prose, mixed] + videos))
    expected = {"video_unsupported": len(GOOD_CLIPS) + 1}
    for _, reason in hostile.values():
        expected[reason] = expected.get(reason, 0) + 1
    return corpus, rows, expected


LIMITS = {"max_video_seconds": 4.0, "max_video_pixels": 200 * 200}


@pytest.mark.parametrize("model", [False, True], ids=["byte-tokenizer", "qwen2-vl"])
def test_clips_are_probed_then_counted_and_nothing_else_is_lost(tmp_path, model):
    corpus, rows, expected = _corpus(tmp_path)
    kw = {"tokenizer": str(qwen_folder_or_skip())} if model else {}
    clean = shard(corpus / "data.jsonl", tmp_path / "clean", **kw)
    m = shard(corpus / "mixed.jsonl", tmp_path / "mixed", **kw, **LIMITS)
    got = stored_members(tmp_path / "mixed")
    assert "prose" in got and clean.stats["skipped"] == {}
    if model:          # Qwen2-VL lays out videos: the good clips' rows are written, the hostile ones counted
        expected.pop("video_unsupported")
        assert m.stats["skipped"] == expected
        assert m.num_samples == len(rows) + 2 + len(GOOD_CLIPS) and m.stats["videos"] == len(GOOD_CLIPS) + 1
        assert {k for k in got if k.startswith("v-")} == {"v-mixed"} | {_video_row(i, c)["id"]
                                                                         for i, c in enumerate(GOOD_CLIPS)}
        return
    assert m.stats["skipped"] == expected
    assert m.num_samples == len(rows) + 1 and "videos" not in m.stats
    assert not any(k.startswith("v-") for k in got)
    assert {k: v for k, v in got.items() if k != "prose"} == stored_members(tmp_path / "clean")
    detail = m.stats["examples"]["video_unsupported"]["detail"]
    assert "probed fine, but vlmdata's own text layout has no video policy yet" in detail


def test_clips_in_data_urls_are_probed_like_files(tmp_path):
    import base64

    def row(i: int, data: bytes, media: str = "video/mp4") -> dict:
        url = f"data:{media};base64,{base64.b64encode(data).decode()}"
        return {"id": f"d{i}", "messages": [
            {"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}}, _text(QUESTION)]},
            {"role": "assistant", "content": "A dog."}]}

    corpus = generate_corpus(tmp_path / "corpus", 2, seed=3, fmt="llava")
    good = make_clip(ClipSpec())
    rows = read_jsonl(corpus / "data.jsonl") + [row(0, good), row(1, make_clip(ClipSpec(video=False))),
                                                 row(2, good, "text/plain")]
    (corpus / "urls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = shard(corpus / "urls.jsonl", tmp_path / "out")
    assert m.stats["skipped"] == {"video_unsupported": 1, "no_video_stream": 1, "bad_data_url": 1}
    assert m.num_samples == 2


def test_clips_over_the_byte_limit_are_never_read(tmp_path):
    corpus = generate_corpus(tmp_path / "corpus", 2, seed=4, fmt="llava")
    (corpus / "clips").mkdir()
    big, small = make_clip(ClipSpec(frames=90)), make_clip(ClipSpec(frames=3, width=32, height=32))
    (corpus / "clips" / "big.mp4").write_bytes(big)
    (corpus / "clips" / "small.mp4").write_bytes(small)
    rows = read_jsonl(corpus / "data.jsonl") + [_video_row(0, "big.mp4"), _video_row(1, "small.mp4")]
    (corpus / "big.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = shard(corpus / "big.jsonl", tmp_path / "out", max_video_bytes=len(small))
    assert m.stats["skipped"] == {"file_too_large": 1, "video_unsupported": 1} and m.num_samples == 2
    assert f"larger than --max-video-bytes {len(small)}" in m.stats["examples"]["file_too_large"]["detail"]


def test_folders_of_clips_with_captions(tmp_path):
    from PIL import Image

    folder = tmp_path / "clips"
    folder.mkdir()
    (folder / "dog.webm").write_bytes(make_clip(GOOD_CLIPS["vp9.webm"]))
    (folder / "dog.txt").write_text("a dog runs")
    (folder / "cut.mp4").write_bytes(make_clip(ClipSpec(frames=60))[:2000])
    (folder / "cut.txt").write_text("cut short")
    (folder / "silent.mov").write_bytes(make_clip(GOOD_CLIPS["rot90.mov"]))     # no caption
    Image.new("RGB", (32, 24), (0, 90, 200)).save(folder / "sky.jpg")
    (folder / "sky.txt").write_text("blue sky")
    m = shard(folder, tmp_path / "out")
    assert m.stats["skipped"] == {"bad_video": 1, "missing_text": 1, "video_unsupported": 1}
    assert m.num_samples == 1 and m.num_images == 1
    assert m.stats["examples"]["video_unsupported"]["id"] == "dog"
    assert "1 clip(s) probed fine" in m.stats["examples"]["video_unsupported"]["detail"]
    assert "silent.mov" in m.stats["examples"]["missing_text"]["detail"]


def test_frame_lists_are_probed_then_counted_without_a_video_policy(tmp_path):
    from PIL import Image

    corpus = generate_corpus(tmp_path / "corpus", 3, seed=2, fmt="llava")
    rows = read_jsonl(corpus / "data.jsonl")
    for i in range(3):
        Image.new("RGB", (32, 24), (80 * i, 10, 10)).save(corpus / f"f{i}.png")
    frames = {"id": "frames", "video": [f"f{i}.png" for i in range(3)], "fps": 1, "conversations": [
        {"from": "human", "value": "<video> what moves?"}, {"from": "gpt", "value": "Nothing."}]}
    (corpus / "frames.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + [frames]))
    m = shard(corpus / "frames.jsonl", tmp_path / "out")
    assert m.stats["skipped"] == {"video_unsupported": 1} and m.num_samples == len(rows)
    assert "1 clip(s) probed fine" in m.stats["examples"]["video_unsupported"]["detail"]


def test_skip_fraction_and_exit_codes_count_video_rows(tmp_path):
    corpus, rows, expected = _corpus(tmp_path)
    with pytest.raises(TooManySkipsError) as err:
        shard(corpus / "mixed.jsonl", tmp_path / "strict", max_skip_fraction=0.1, **LIMITS)
    assert err.value.summary.skipped == expected
    only_videos = [json.loads(line) for line in (corpus / "mixed.jsonl").read_text().splitlines()][len(rows) + 2:]
    (corpus / "videos.jsonl").write_text("".join(json.dumps(r) + "\n" for r in only_videos))
    cli = [sys.executable, "-m", "vlmdata", "shard", "--workers", "0", "--max-video-seconds", "4",
           "--max-video-pixels", str(200 * 200)]
    r = subprocess.run([*cli, str(corpus / "videos.jsonl"), "-o", str(tmp_path / "none")], capture_output=True,
                       text=True)
    assert r.returncode == 2, r.stderr
    assert "video_unsupported=5" in r.stderr and "no video policy yet" in r.stderr
    r = subprocess.run([*cli, str(corpus / "mixed.jsonl"), "-o", str(tmp_path / "cli")], capture_output=True,
                       text=True)
    assert r.returncode == 3, r.stderr
    assert "video_unsupported=6" in r.stderr


@pytest.mark.parametrize("option", ["max_video_bytes", "max_video_seconds", "max_video_pixels", "max_video_frames",
                                    "max_probe_seconds"])
def test_video_limits_must_be_positive(tmp_path, option):
    corpus = generate_corpus(tmp_path / "corpus", 1, seed=1, fmt="llava")
    with pytest.raises(ConfigError, match=f"--{option.replace('_', '-')} must be > 0"):
        shard(corpus / "data.jsonl", tmp_path / "out", **{option: 0})
