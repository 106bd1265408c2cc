"""`vlmdata shard --video-transcode SIDE:FPS`: a default run stores each clip byte for byte; a transcode run
stores the re-encoded clip with the probe of what it stored and records its settings in the manifest; hostile
clips (the probe's reasons, a transcode over its time limit) are counted skips that cost only themselves; a
resumed run keeps its first run's settings; the command line takes the option."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from tests.helpers.corpus import generate_corpus
from tests.helpers.models import qwen_folder_or_skip
from tests.helpers.shards import read_jsonl, shard, stored_members, tar_tree
from vlmdata.errors import ConfigError
from vlmdata.formats import Manifest
from vlmdata.testing import ClipSpec, make_clip
from vlmdata.video import ClipInfo, parse_transcode, probe_clip

GOOD = {"rot90.mov": ClipSpec(container="mov", rotation=90, width=128, height=96, frames=30, audio=True),
        "vp9.webm": ClipSpec(container="webm", codec="libvpx-vp9", fps=25, frames=25, width=160, height=90)}
HOSTILE = {"radio.mp4": "no_video_stream", "cut.mp4": "bad_video"}
SPEC = "64:2"


def _hostile(name: str) -> bytes:
    if name == "radio.mp4":
        return make_clip(ClipSpec(video=False))
    whole = make_clip(ClipSpec(frames=30))
    return whole[: len(whole) * 6 // 10]         # its index is cut off


def _key(name: str) -> str:
    return "v-" + name.replace(".", "-")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = generate_corpus(tmp_path_factory.mktemp("transcode") / "corpus", 2, seed=7, fmt="llava")
    (root / "clips").mkdir()
    clips = {name: make_clip(spec) for name, spec in GOOD.items()} | {n: _hostile(n) for n in HOSTILE}
    for name, data in clips.items():
        (root / "clips" / name).write_bytes(data)
    rows = read_jsonl(root / "data.jsonl") + [
        {"id": _key(name), "video": f"clips/{name}", "conversations": [
            {"from": "human", "value": "<video>\nWhat happens?"}, {"from": "gpt", "value": f"Clip {name}."}]}
        for name in clips]
    (root / "videos.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "videos.jsonl", clips


def _clip_members(out) -> dict[str, tuple[str, bytes, ClipInfo]]:
    """key -> (the clip member's extension, its bytes, its stored probe), for samples holding one clip."""
    found = {}
    for key, members in stored_members(out).items():
        clip = [m for m in members if m.startswith("v0.") and m != "v0.clip.json"]
        if clip:
            info = ClipInfo.from_dict(json.loads(members["v0.clip.json"]))
            found[key] = (clip[0].split(".", 1)[1], members[clip[0]], info)
    return found


def test_a_default_run_keeps_clips_and_a_transcode_run_stores_them_reencoded(corpus, tmp_path):
    rows, clips = corpus
    tok = str(qwen_folder_or_skip())
    kept = shard(rows, tmp_path / "kept", tokenizer=tok)
    done = shard(rows, tmp_path / "done", tokenizer=tok, video_transcode=SPEC)
    hostile = {reason: 1 for reason in HOSTILE.values()}
    assert kept.stats["skipped"] == done.stats["skipped"] == hostile
    assert kept.num_samples == done.num_samples == 2 + len(GOOD)
    assert "video_transcode" not in kept.stats
    assert Manifest.load(str(tmp_path / "done")).stats["video_transcode"] == asdict(parse_transcode(SPEC))
    original, reencoded = _clip_members(tmp_path / "kept"), _clip_members(tmp_path / "done")
    settings = parse_transcode(SPEC)
    for name in GOOD:
        ext, data, info = original[_key(name)]
        assert data == clips[name] and info.to_dict() == probe_clip(clips[name]).to_dict()  # byte for byte, its own probe
        ext, data, info = reencoded[_key(name)]
        assert ext == "mp4" and info.to_dict() == probe_clip(data).to_dict() and data != clips[name]
        assert info.codec == "h264" and info.rotation == 0 and max(info.width, info.height) <= settings.max_side
        assert info.average_fps == pytest.approx(min(settings.max_fps, probe_clip(clips[name]).measured_fps))


def test_a_transcode_over_its_time_limit_is_a_counted_skip(corpus, tmp_path):
    rows, _ = corpus
    m = shard(rows, tmp_path / "out", tokenizer=str(qwen_folder_or_skip()), video_transcode=SPEC,
              max_transcode_seconds=1e-9)
    assert m.stats["skipped"] == {"transcode_failed": len(GOOD), **{reason: 1 for reason in HOSTILE.values()}}
    assert m.num_samples == 2 and "took over" in m.stats["examples"]["transcode_failed"]["detail"]


def test_rows_without_a_video_policy_are_probed_not_transcoded(corpus, tmp_path):
    """vlmdata's own text layout writes no videos: its clips are probed and counted, no transcode is tried."""
    rows, _ = corpus
    m = shard(rows, tmp_path / "out", video_transcode=SPEC, max_transcode_seconds=1e-9)
    assert m.stats["skipped"] == {"video_unsupported": len(GOOD), **{reason: 1 for reason in HOSTILE.values()}}


def test_a_resumed_run_keeps_its_first_runs_transcode(corpus, tmp_path):
    rows, _ = corpus
    tok = str(qwen_folder_or_skip())
    out = tmp_path / "out"
    first = shard(rows, out, tokenizer=tok, video_transcode=SPEC, max_samples_per_shard=2)
    before = tar_tree(out)
    last = f"job-{first.stats['jobs'] - 1:06d}.json"
    (out / "_jobs" / last).unlink()                  # the last job (both good clips' rows) is run again
    again = shard(rows, out, tokenizer=tok, resume=True, max_samples_per_shard=2)
    assert again.stats["resumed_jobs"] == first.stats["jobs"] - 1
    assert again.stats["video_transcode"] == first.stats["video_transcode"] and tar_tree(out) == before
    for other in ("96:2", "off"):
        with pytest.raises(ConfigError, match="different settings than the first run \\(video\\)"):
            shard(rows, out, tokenizer=tok, resume=True, max_samples_per_shard=2, video_transcode=other)


def test_a_resumed_run_keeps_its_first_runs_time_limit_and_refuses_another(corpus, tmp_path):
    """The limit decides which clips are transcode_failed: a resume without it keeps the first run's, one with
    another is refused (with or without --video-transcode), one with the same one runs."""
    rows, _ = corpus
    tok = str(qwen_folder_or_skip())
    out = tmp_path / "out"
    first = shard(rows, out, tokenizer=tok, video_transcode=SPEC, max_transcode_seconds=60, max_samples_per_shard=2)
    last = out / "_jobs" / f"job-{first.stats['jobs'] - 1:06d}.json"
    for given in ({}, {"video_transcode": SPEC}):
        with pytest.raises(ConfigError, match="--max-transcode-seconds 1e-09, but the first run used 60"):
            shard(rows, out, tokenizer=tok, resume=True, max_samples_per_shard=2, max_transcode_seconds=1e-9, **given)
    for given in ({}, {"max_transcode_seconds": 60}, {"video_transcode": SPEC}):
        last.unlink()
        again = shard(rows, out, tokenizer=tok, resume=True, max_samples_per_shard=2, **given)
        assert again.stats["video_transcode"] == first.stats["video_transcode"]
        assert again.stats["skipped"] == first.stats["skipped"]


def test_the_command_line_takes_the_option(corpus, tmp_path, capsys):
    from vlmdata.cli import main

    rows, _ = corpus
    tok = str(qwen_folder_or_skip())
    assert main(["shard", str(rows), "-o", str(tmp_path / "bad"), "--video-transcode", "448"]) == 2
    assert "--video-transcode '448': use SIDE:FPS" in capsys.readouterr().err
    code = main(["shard", str(rows), "-o", str(tmp_path / "out"), "--workers", "0", "--tokenizer", tok,
                 "--video-transcode", SPEC, "--max-transcode-seconds", "60"])
    assert code == 0
    assert Manifest.load(str(tmp_path / "out")).stats["video_transcode"] == asdict(
        parse_transcode(SPEC, max_seconds=60))
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "out"), "--samples", "0"]) == 0
    assert f"re-encoded with --video-transcode {SPEC} (H.264" in capsys.readouterr().out
