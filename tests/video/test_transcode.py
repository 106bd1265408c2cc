"""`transcode_clip`: the re-encoded clip's probe shows the bounds held (size, even sides, aspect ratio, constant
rate, keyframe spacing, rotation 0, no audio), its frame count and duration follow the target rate, a rotated
clip comes out upright, and a transcode over its limits is a `transcode_failed` ClipProblem."""
from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

from vlmdata.errors import ConfigError
from vlmdata.testing import ClipSpec, make_clip
from vlmdata.video import ClipProblem, decode_frames, parse_transcode, probe_clip, transcode_clip

CLIPS = {"h264-320x180": ClipSpec(width=320, height=180, frames=60, gop=60),
         "vp9-mkv-audio": ClipSpec(container="mkv", codec="libvpx-vp9", fps=25, frames=50, width=200, height=150,
                                   audio=True),
         "mpeg4-mkv-odd": ClipSpec(container="mkv", codec="mpeg4", width=130, height=74, frames=40),
         "vfr": ClipSpec(variable_rate=True, frames=40, fps=24),
         "rot90-mov": ClipSpec(container="mov", rotation=90, width=160, height=96, frames=30),
         "slower-than-target": ClipSpec(fps=2, frames=8, gop=4)}


def _streams(data: bytes) -> list[str]:
    import av

    with av.open(io.BytesIO(data)) as c:
        return [s.type for s in c.streams]


@pytest.mark.parametrize("name", list(CLIPS))
def test_the_transcoded_clip_holds_its_bounds(name):
    data = make_clip(CLIPS[name])
    settings = parse_transcode("64:4")
    before = probe_clip(data)
    out = transcode_clip(data, before, settings)
    after = probe_clip(out)
    upright = (before.height, before.width) if before.rotation % 180 else (before.width, before.height)
    rate = min(settings.max_fps, before.measured_fps)
    assert after.codec == "h264" and after.rotation == 0 and _streams(out) == ["video"]
    assert max(after.width, after.height) <= settings.max_side and after.width % 2 == 0 and after.height % 2 == 0
    assert max(after.width, after.height) >= settings.max_side - 2 or max(upright) < settings.max_side
    assert (after.width > after.height) == (upright[0] > upright[1])
    assert abs(after.width / after.height - upright[0] / upright[1]) < 2 / min(after.width, after.height) + 0.02
    assert after.average_fps == pytest.approx(rate) and after.measured_fps == pytest.approx(rate)
    assert not after.variable_rate
    assert after.frames == math.ceil(before.duration_s * rate - 1e-6)
    assert after.duration_s == pytest.approx(after.frames / rate)
    assert abs(after.duration_s - before.duration_s) < 1 / rate
    gop = max(1, round(settings.keyframe_s * rate))
    assert after.keyframes[0] == 0 and np.diff(np.append(after.keyframes, after.frames)).max() <= gop


def _resized(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    return np.asarray(Image.fromarray(frame).resize(size, Image.BILINEAR), dtype=np.float64)


@pytest.mark.parametrize("rotation", [90, 180, 270])
def test_a_rotated_clip_comes_out_upright(rotation):
    """The reference: PyAV's decode of the original frame turned as its display matrix says (FFmpeg's
    av_display_rotation_get: the angle the frame is turned counter-clockwise for display; numpy's rot90 turns
    counter-clockwise), then resized. The transcoded frame is nearest to it of the four orientations."""
    data = make_clip(ClipSpec(rotation=rotation, width=96, height=64, frames=12, fps=12, gop=6))
    before = probe_clip(data)
    after_data = transcode_clip(data, before, parse_transcode("48:12"))
    after = probe_clip(after_data)
    got = decode_frames(after_data, after, [5])[0].astype(np.float64)
    original = decode_frames(data, before, [5])[0]
    size = (after.width, after.height)
    same_shape = [k for k in range(4) if k % 2 == rotation // 90 % 2]      # turns giving the output's aspect
    diffs = {k: np.abs(_resized(np.rot90(original, k), size) - got).mean() for k in same_shape}
    assert after.rotation == 0 and (after.width < after.height) == (rotation % 180 == 90)
    assert min(diffs, key=diffs.get) == rotation // 90 and diffs[rotation // 90] < 8
    assert all(d > 3 * diffs[rotation // 90] for k, d in diffs.items() if k != rotation // 90)


def test_frames_are_the_last_shown_at_each_output_time():
    """Output frame k (time k / rate) is the input frame on screen at that time, pixel-close to PyAV's decode."""
    data = make_clip(ClipSpec(width=64, height=48, frames=30, fps=30, gop=10))
    before = probe_clip(data)
    after_data = transcode_clip(data, before, parse_transcode("64:5"))
    after = probe_clip(after_data)
    times = before.frame_times
    shown = [int(np.searchsorted(times, k / 5 + 1e-6, side="right")) - 1 for k in range(after.frames)]
    want = decode_frames(data, before, shown)
    got = decode_frames(after_data, after, range(after.frames))
    assert len(set(shown)) == after.frames        # 30 fps to 5 fps: every output frame a different input frame
    for w, g in zip(want, got):
        assert np.abs(w.astype(int) - g.astype(int)).mean() < 6


def test_a_transcode_over_its_time_limit_is_a_counted_problem():
    data = make_clip(ClipSpec(frames=30))
    with pytest.raises(ClipProblem) as exc:
        transcode_clip(data, probe_clip(data), parse_transcode("64:2", max_seconds=1e-9))
    assert exc.value.reason == "transcode_failed" and "took over" in str(exc.value)


@pytest.mark.parametrize("spec", ["448", "448:", "x:2", "448:0", "1:2", "448:-1", "448:1000"])
def test_bad_transcode_specs_are_config_errors(spec):
    with pytest.raises(ConfigError, match="--video-transcode"):
        parse_transcode(spec)


def test_off_and_none_keep_clips():
    assert parse_transcode(None) is None and parse_transcode("off") is None
    assert parse_transcode("448:2.5").spec == "448:2.5"


def test_an_encoder_failure_is_transcode_failed_and_a_decode_failure_undecodable():
    """The encoder refusing its options (a preset libx264 does not know) is the transcode's failure, with FFmpeg's
    message; input that does not decode (the clip cut short after its probe) stays undecodable_video."""
    from dataclasses import replace

    data = make_clip(ClipSpec(frames=20))
    info = probe_clip(data)
    settings = parse_transcode("64:2")
    with pytest.raises(ClipProblem) as exc:
        transcode_clip(data, info, replace(settings, preset="no-such-preset"))
    assert exc.value.reason == "transcode_failed"
    assert str(exc.value).startswith("encoding failed") and "avcodec_open2(\"libx264\"" in str(exc.value)
    assert "no-such-preset" in str(exc.value)       # PyAV opens the encoder with the first frame
    with pytest.raises(ClipProblem) as exc:
        transcode_clip(data[: len(data) * 6 // 10], info, settings)
    assert exc.value.reason == "undecodable_video" and "decoding for the transcode failed" in str(exc.value)
