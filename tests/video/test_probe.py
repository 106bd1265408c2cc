"""probe_clip on clips made here: what it reports equals what a full decode sees; hostile clips are refused by reason."""
from __future__ import annotations

import io
from fractions import Fraction

import numpy as np
import pytest

from vlmdata.errors import Skip
from vlmdata.testing import ClipSpec, make_clip
from vlmdata.video import ClipInfo, ClipLimits, ClipProblem, probe_clip

av = pytest.importorskip("av")

CODECS = [ClipSpec(), ClipSpec(container="webm", codec="libvpx-vp9", fps=25, frames=50),
          ClipSpec(container="mkv", codec="mpeg4", width=128, height=72), ClipSpec(container="mov", gop=5),
          ClipSpec(fps=24, frames=48, faststart=True)]


def decoded_times(data: bytes) -> tuple[list[float], list[bool]]:
    """Every frame's time (s) and keyframe flag, from a full decode: the reference for the probe."""
    with av.open(io.BytesIO(data)) as c:
        frames = list(c.decode(video=0))
        start = frames[0].time
        return [f.time - start for f in frames], [f.key_frame for f in frames]


@pytest.mark.parametrize("spec", CODECS, ids=lambda s: f"{s.container}-{s.codec}")
def test_probe_matches_a_full_decode(spec):
    data = make_clip(spec)
    info = probe_clip(data)
    times, keys = decoded_times(data)
    assert info.frames == spec.frames == len(times)
    np.testing.assert_allclose(info.frame_times, times, atol=1e-9)
    assert info.keyframes.tolist() == [i for i, k in enumerate(keys) if k]
    assert len(info.keyframes) >= spec.frames // spec.gop     # the encoder's GOP: seek points to use
    assert (info.width, info.height, info.rotation) == (spec.width, spec.height, 0)
    assert info.average_fps == pytest.approx(spec.fps)
    assert info.measured_fps == pytest.approx(spec.fps, rel=0.02)
    assert info.duration_s == pytest.approx(spec.frames / spec.fps, rel=0.02)
    assert not info.variable_rate
    assert info.codec in {"h264", "vp9", "mpeg4"}


def test_variable_frame_rate_is_measured_not_assumed():
    spec = ClipSpec(variable_rate=True, frames=40)
    data = make_clip(spec)
    info = probe_clip(data)
    times, _ = decoded_times(data)
    assert info.variable_rate and info.frames == 40
    np.testing.assert_allclose(info.frame_times, times, atol=1e-9)
    # frames last 1-3 ticks: the measured rate is well under the nominal one, and matches the frame times
    assert info.measured_fps == pytest.approx(40 / (times[-1] + np.median(np.diff(times))), rel=1e-6)
    assert info.measured_fps < 0.8 * spec.fps


@pytest.mark.parametrize("degrees", [90, 180, 270])
def test_rotation_comes_from_the_display_matrix(degrees):
    info = probe_clip(make_clip(ClipSpec(rotation=degrees, frames=6)))
    assert info.rotation == degrees


def test_audio_track_is_ignored_and_round_trips_through_json():
    info = probe_clip(make_clip(ClipSpec(audio=True, frames=30)))
    assert info.frames == 30
    back = ClipInfo.from_dict(info.to_dict())
    assert back.frames == 30 and np.array_equal(back.frame_pts, info.frame_pts)
    assert back.time_base == info.time_base and isinstance(back.time_base, Fraction)
    assert [back.pts_of(i) for i in (0, 7, 29)] == [info.pts_of(i) for i in (0, 7, 29)]


def hostile_clips() -> dict[str, tuple[bytes, ClipLimits, str]]:
    plain = make_clip(ClipSpec(frames=120))
    streamed = make_clip(ClipSpec(frames=300, faststart=True))
    return {
        "zero bytes": (b"", ClipLimits(), Skip.EMPTY_FILE),
        "audio only": (make_clip(ClipSpec(video=False)), ClipLimits(), Skip.NO_VIDEO_STREAM),
        "no frames": (make_clip(ClipSpec(frames=0, audio=True, container="mkv")), ClipLimits(), Skip.NO_VIDEO_FRAMES),
        "index cut off": (plain[: len(plain) * 6 // 10], ClipLimits(), Skip.BAD_VIDEO),
        "cut short (the index claims 10 s)": (streamed[: len(streamed) // 2], ClipLimits(), Skip.TRUNCATED_VIDEO),
        "garbage behind an mp4 header": (b"\0\0\0\x18ftypmp42" + bytes(range(256)) * 40, ClipLimits(), Skip.BAD_VIDEO),
        "longer than allowed": (plain, ClipLimits(max_duration_s=2.0), Skip.VIDEO_TOO_LONG),
        "more frames than allowed": (plain, ClipLimits(max_frames=50), Skip.VIDEO_TOO_LONG),
        "frames larger than allowed": (plain, ClipLimits(max_frame_pixels=96 * 64 - 1), Skip.VIDEO_TOO_LARGE),
    }


@pytest.mark.parametrize("name", list(hostile_clips()))
def test_hostile_clips_are_refused_by_reason(name):
    data, limits, reason = hostile_clips()[name]
    with pytest.raises(ClipProblem) as err:
        probe_clip(data, limits)
    assert err.value.reason == reason, str(err.value)

