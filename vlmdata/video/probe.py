"""What a video clip holds, read from its container without decoding more than its first frame.

`probe_clip(data)` demuxes the clip's video packets (no decoding) to get every frame's
presentation time and which frames are keyframes, then decodes the first frame only, to
prove the stream decodes and to read its display rotation. From that it reports the
duration, the declared (average) and measured frame rates, whether the rate is variable,
the frame count, the size, the codec and the keyframe positions: everything a sampler
needs to choose frames, and a seeking decoder needs to fetch them, before any decode.

Every probe is bounded (`ClipLimits`): a clip larger than the frame-size limit is refused
from its header before anything is decoded; demuxing stops at the duration, packet and
wall-clock limits; a container whose packets end before its declared duration (truncated,
or lying about its length) is refused. A refused clip raises `ClipProblem` with one of the
`Skip` reasons, so it costs only itself.
"""
from __future__ import annotations

import io
import time
from dataclasses import asdict, dataclass
from fractions import Fraction

import numpy as np

from vlmdata.errors import Skip, SkipError

__all__ = ["ClipInfo", "ClipLimits", "ClipProblem", "probe_clip"]


class ClipProblem(SkipError):
    """A clip that cannot be used, with the `Skip` reason it is counted under."""


@dataclass(frozen=True)
class ClipLimits:
    """What a probe accepts and how long it may take."""

    max_duration_s: float = 3 * 3600.0        # longer clips are refused (video_too_long)
    max_frame_pixels: int = 8192 * 8192       # larger frames are refused from the header (video_too_large)
    max_frames: int = 2_000_000               # demux stops and refuses past this many packets
    max_probe_s: float = 30.0                 # wall-clock budget of one probe
    truncation_tolerance: float = 0.10        # packets may end this share (and 1 s) short of the declared length


@dataclass(frozen=True)
class ClipInfo:
    """A clip's metadata; frames are in presentation order, their times relative to the first one."""

    codec: str
    width: int
    height: int
    rotation: int                # counter-clockwise degrees from the display matrix (0, 90, 180, 270)
    frames: int
    duration_s: float            # first frame to the end of the last one
    average_fps: float           # what the container declares
    measured_fps: float          # frames / duration, from the packets' times
    variable_rate: bool          # frame intervals differ by more than 1 % from their median
    frame_pts: np.ndarray        # int64 presentation times minus start_pts, in time_base units, one per frame
    keyframes: np.ndarray        # int64 frame indices of keyframes (seek points)
    time_base: Fraction
    start_pts: int
    # a window (`video.frames.decode_window`): the ascending frame indices whose times `frame_pts` holds, and
    # `keyframes` only some keyframes; None: every frame's time and every keyframe
    pts_frames: np.ndarray | None = None

    @property
    def frame_times(self) -> np.ndarray:
        """Seconds from the first frame, one per frame (a window's info has not every frame's time)."""
        if self.pts_frames is not None:
            raise ValueError("this clip info is a decode window: it holds the times of some frames only")
        return self.frame_pts.astype(np.float64) * float(self.time_base)

    def pts_of(self, index: int) -> int:
        """The presentation timestamp (stream time base) of frame `index`."""
        if self.pts_frames is None:
            return self.start_pts + int(self.frame_pts[index])
        at = int(np.searchsorted(self.pts_frames, index))
        if at == len(self.pts_frames) or self.pts_frames[at] != index:
            raise KeyError(f"frame {index} is outside this clip info's decode window")
        return self.start_pts + int(self.frame_pts[at])

    def frame_by_pts(self) -> dict[int, int]:
        """Frame index by presentation timestamp, for every frame whose time this info holds."""
        indices = range(self.frames) if self.pts_frames is None else self.pts_frames.tolist()
        return {int(p) + self.start_pts: int(i) for i, p in zip(indices, self.frame_pts.tolist())}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["frame_pts"] = self.frame_pts.tolist()
        d["keyframes"] = self.keyframes.tolist()
        d["time_base"] = [self.time_base.numerator, self.time_base.denominator]
        if self.pts_frames is None:
            del d["pts_frames"]            # a whole clip's probe, as stored beside it in the shards
        else:
            d["pts_frames"] = self.pts_frames.tolist()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ClipInfo:
        d = dict(d)
        d["frame_pts"] = np.asarray(d["frame_pts"], dtype=np.int64)
        d["keyframes"] = np.asarray(d["keyframes"], dtype=np.int64)
        d["time_base"] = Fraction(*d["time_base"])
        if d.get("pts_frames") is not None:
            d["pts_frames"] = np.asarray(d["pts_frames"], dtype=np.int64)
        return cls(**d)


def _open(data: bytes):
    import av

    try:
        return av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except (av.error.FFmpegError, ValueError, OSError) as exc:
        raise ClipProblem(Skip.BAD_VIDEO, f"not a readable video container: {exc}") from None


def _packet_times(container, stream, limits: ClipLimits, started: float) -> tuple[list[int], list[int], bool]:
    """Presentation times and keyframe pts of every video packet; True when demuxing failed part way."""
    import av

    pts, keys = [], []
    try:
        for packet in container.demux(stream):
            if packet.pts is None:            # the flush packet (or a packet without a time: not a frame)
                continue
            pts.append(packet.pts)
            if packet.is_keyframe:
                keys.append(packet.pts)
            if len(pts) > limits.max_frames:
                raise ClipProblem(Skip.VIDEO_TOO_LONG, f"more than {limits.max_frames} frames")
            if len(pts) % 4096 == 0 and time.monotonic() - started > limits.max_probe_s:
                raise ClipProblem(Skip.BAD_VIDEO, f"probing took over {limits.max_probe_s:.0f} s")
    except av.error.FFmpegError:
        return pts, keys, True
    return pts, keys, False


def _first_frame_rotation(data: bytes) -> int:
    """Decode the first frame (proving the stream decodes) and return its display rotation."""
    import av

    with _open(data) as container:
        stream = container.streams.video[0]
        stream.thread_type = "NONE"
        try:
            frame = next(container.decode(stream), None)
        except (av.error.FFmpegError, ValueError) as exc:
            raise ClipProblem(Skip.UNDECODABLE_VIDEO, f"the first frame does not decode: {exc}") from None
        if frame is None:
            raise ClipProblem(Skip.UNDECODABLE_VIDEO, "no frame decodes")
        return int(round(getattr(frame, "rotation", 0) or 0)) % 360


def _declared_duration(container, stream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000
    return None


def probe_clip(data: bytes, limits: ClipLimits = ClipLimits()) -> ClipInfo:
    """The metadata of the clip in `data` (mp4, webm, mkv, mov, ...), or ClipProblem."""
    started = time.monotonic()
    if not data:
        raise ClipProblem(Skip.EMPTY_FILE, "zero bytes")
    with _open(data) as container:
        if not container.streams.video:
            raise ClipProblem(Skip.NO_VIDEO_STREAM, "the container has no video stream (audio only?)")
        stream = container.streams.video[0]
        ctx = stream.codec_context
        width, height = int(ctx.width or 0), int(ctx.height or 0)
        if width <= 0 or height <= 0:
            raise ClipProblem(Skip.BAD_VIDEO, f"frame size {width}x{height}")
        if width * height > limits.max_frame_pixels:
            raise ClipProblem(Skip.VIDEO_TOO_LARGE, f"{width}x{height} frames exceed {limits.max_frame_pixels} pixels")
        declared = _declared_duration(container, stream)
        if declared is not None and declared > limits.max_duration_s:
            raise ClipProblem(Skip.VIDEO_TOO_LONG, f"{declared:.0f} s declared, limit {limits.max_duration_s:.0f} s")
        time_base = stream.time_base or Fraction(1, 90000)
        average = float(stream.average_rate or stream.guessed_rate or 0)
        codec = ctx.name
        pts, key_pts, broken = _packet_times(container, stream, limits, started)
    if not pts:
        raise ClipProblem(Skip.NO_VIDEO_FRAMES, "the video stream has no frames")
    return _describe(data, limits, codec, width, height, declared, average, time_base, pts, key_pts, broken)


def _describe(data, limits, codec, width, height, declared, average, time_base, pts, key_pts, broken) -> ClipInfo:
    order = np.sort(np.asarray(pts, dtype=np.int64))
    if np.any(np.diff(order) == 0):
        order = np.unique(order)              # duplicate timestamps are one presentation time
    start = int(order[0])
    times = (order - start).astype(np.float64) * float(time_base)
    steps = np.diff(times)
    step = float(np.median(steps)) if steps.size else (1.0 / average if average else 0.0)
    duration = float(times[-1] + step)
    if duration > limits.max_duration_s:
        raise ClipProblem(Skip.VIDEO_TOO_LONG, f"{duration:.0f} s of frames, limit {limits.max_duration_s:.0f} s")
    short = declared is not None and duration < declared * (1 - limits.truncation_tolerance) - 1.0
    if broken or short:
        what = "demuxing failed part way" if broken else f"{duration:.2f} s of frames of {declared:.2f} s declared"
        raise ClipProblem(Skip.TRUNCATED_VIDEO, what)
    rotation = _first_frame_rotation(data)
    jitter = max(0.01 * step, 1.5 * float(time_base))     # millisecond time bases round 33.3 ms to 33 or 34
    variable = bool(steps.size and np.any(np.abs(steps - step) > jitter))
    keyframes = np.searchsorted(order, np.unique(np.asarray(key_pts, dtype=np.int64)))
    return ClipInfo(codec=codec, width=width, height=height, rotation=rotation, frames=int(order.size),
                    duration_s=duration, average_fps=average,
                    measured_fps=float(order.size / duration) if duration > 0 else average,
                    variable_rate=variable, frame_pts=order - start, keyframes=keyframes.astype(np.int64),
                    time_base=Fraction(time_base), start_pts=start)
