"""Re-encoding a clip to a bounded size and frame rate (`vlmdata shard --video-transcode SIDE:FPS`).

`transcode_clip(data, info, settings)` decodes the probed clip once, in presentation order, and writes a new
H.264 mp4 (PyAV's bundled FFmpeg, libx264) that is:

- upright: the display rotation (`info.rotation`, counter-clockwise degrees) is applied to the pixels, as
  FFmpeg's own autorotate does, and the new clip carries no display matrix;
- at most `max_side` pixels on its longer side (never scaled up), aspect ratio kept, both sides even;
- at a constant rate of `min(max_fps, the clip's measured rate)`: output frame k (time k / rate) is the last
  input frame shown at that time, so the clip keeps its duration and has ceil(duration * rate) frames;
- a keyframe every `keyframe_s` seconds of output (at least every frame), so a seeking decoder never
  decodes more than one short GOP per sampled frame;
- without audio (or any other stream).

Every transcode is bounded: the input was probed (and refused there when hostile) first; the transcode stops
after `max_seconds` of wall-clock time, and when the decoder yields more frames than the probe counted;
either raises `ClipProblem(transcode_failed)`, so a hostile clip costs only itself. A frame that does not
decode raises `ClipProblem(undecodable_video)`; a failure of the output side (scaling and turning a frame,
the encoder, the mp4 muxer) raises `ClipProblem(transcode_failed)` with FFmpeg's message: the clip decodes,
the transcode is what broke.
"""
from __future__ import annotations

import io
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from vlmdata.errors import ConfigError, Skip
from vlmdata.video.probe import ClipInfo, ClipProblem

__all__ = ["DEFAULT_TRANSCODE_SECONDS", "TRANSCODE_OFF", "TranscodeSettings", "parse_transcode", "transcode_clip",
           "transcoded_size"]

DEFAULT_TRANSCODE_SECONDS = 300.0
TRANSCODE_OFF = "off"
FRAME_SLACK = 16                  # frames a decoder may yield beyond the probed count (e.g. a repeated last frame)


@dataclass(frozen=True)
class TranscodeSettings:
    """What a transcoded clip may be, and how long making one may take."""

    max_side: int                 # longer side of the upright frames, in pixels (never scaled up)
    max_fps: float                # constant output rate (a slower clip keeps its own rate)
    keyframe_s: float = 1.0       # a keyframe every this many seconds of output
    crf: int = 23                 # libx264 constant rate factor (quality)
    preset: str = "veryfast"      # libx264 speed / size trade-off
    max_seconds: float = DEFAULT_TRANSCODE_SECONDS   # wall-clock limit of one clip's transcode

    @property
    def spec(self) -> str:
        """The `--video-transcode` value these settings came from."""
        return f"{self.max_side}:{self.max_fps:g}"


def parse_transcode(spec: str | None, max_seconds: float = DEFAULT_TRANSCODE_SECONDS) -> TranscodeSettings | None:
    """`--video-transcode`: "SIDE:FPS" (e.g. "448:2") as settings; None or "off": clips kept as they are."""
    if spec is None or spec.strip().lower() == TRANSCODE_OFF:
        return None
    side, sep, fps = spec.partition(":")
    try:
        settings = TranscodeSettings(max_side=int(side), max_fps=float(fps), max_seconds=float(max_seconds))
    except ValueError:
        settings = None
    if not sep or settings is None or settings.max_side < 2 or not 0 < settings.max_fps <= 240:
        raise ConfigError(f"--video-transcode {spec!r}: use SIDE:FPS, e.g. 448:2 (SIDE >= 2 pixels, 0 < FPS <= 240), "
                          "or off")
    if not settings.max_seconds > 0:
        raise ConfigError(f"--max-transcode-seconds must be > 0, got {max_seconds}")
    return settings


def _quarter_turns(rotation: int) -> int:
    """The display rotation as counter-clockwise quarter turns (0-3)."""
    return int(round(rotation / 90.0)) % 4


def transcoded_size(info: ClipInfo, settings: TranscodeSettings) -> tuple[int, int]:
    """(width, height) of the upright transcoded frames: the longer side at most `max_side`, both even."""
    width, height = (info.height, info.width) if _quarter_turns(info.rotation) % 2 else (info.width, info.height)
    scale = min(1.0, settings.max_side / max(width, height))
    return max(2, int(width * scale) // 2 * 2), max(2, int(height * scale) // 2 * 2)


def output_rate(info: ClipInfo, settings: TranscodeSettings) -> Fraction:
    """The transcoded clip's constant frame rate: `max_fps`, or the clip's own measured rate when slower."""
    rate = min(settings.max_fps, info.measured_fps) if info.measured_fps > 0 else settings.max_fps
    return Fraction(rate).limit_denominator(1001)


class _Encoder:
    """The output mp4: one libx264 stream at a constant rate, given decoded frames it scales and turns upright
    (yuv420p); any FFmpeg error of its own is ClipProblem(transcode_failed)."""

    def __init__(self, av, size: tuple[int, int], rate: Fraction, turns: int, settings: TranscodeSettings):
        self.av, self.size, self.turns = av, size, turns
        self.buffer = io.BytesIO()
        self.time_base = 1 / rate
        self.written = 0
        self.container = None
        try:
            with self._failing("setting up the encoder"):
                self._open(rate, settings)
        except ClipProblem:
            self.abort()
            raise

    def _open(self, rate: Fraction, settings: TranscodeSettings) -> None:
        self.container = self.av.open(self.buffer, mode="w", format="mp4")
        self.stream = self.container.add_stream("libx264", rate=rate)
        self.stream.width, self.stream.height = self.size
        self.stream.pix_fmt = "yuv420p"
        self.stream.codec_context.time_base = self.time_base
        gop = max(1, int(round(settings.keyframe_s * rate)))
        self.stream.codec_context.gop_size = gop
        self.stream.options = {"g": str(gop), "keyint_min": str(gop), "crf": str(settings.crf),
                               "preset": settings.preset, "threads": "1"}   # a shard worker is one core

    @contextmanager
    def _failing(self, what: str):
        try:
            yield
        except self.av.error.FFmpegError as exc:
            raise ClipProblem(Skip.TRANSCODE_FAILED, f"{what} failed: {exc}") from None

    def write(self, decoded) -> None:
        with self._failing("encoding"):
            frame = _upright(self.av, decoded, self.size, self.turns)
            frame.pts, frame.time_base = self.written, self.time_base
            for packet in self.stream.encode(frame):
                self.container.mux(packet)
        self.written += 1

    def finish(self) -> bytes:
        with self._failing("finishing the encode"):
            for packet in self.stream.encode():
                self.container.mux(packet)
            self.container.close()
        return self.buffer.getvalue()

    def abort(self) -> None:
        if self.container is not None:
            try:
                self.container.close()
            except self.av.error.FFmpegError:
                pass                       # an encoder that never opened: nothing to flush


def _upright(av, frame, size: tuple[int, int], turns: int):
    """The decoded frame scaled to `size` (upright width, height) and turned upright, as yuv420p."""
    if not turns:
        return frame.reformat(width=size[0], height=size[1], format="yuv420p", interpolation="AREA")
    coded = (size[1], size[0]) if turns % 2 else size
    rgb = frame.reformat(width=coded[0], height=coded[1], format="rgb24", interpolation="AREA").to_ndarray()
    turned = np.ascontiguousarray(np.rot90(rgb, turns))
    return av.VideoFrame.from_ndarray(turned, format="rgb24").reformat(format="yuv420p")


def transcode_clip(data: bytes, info: ClipInfo, settings: TranscodeSettings) -> bytes:
    """The clip `data` (probed as `info`) re-encoded within `settings` (see the module doc); ClipProblem when
    it breaks a limit or does not decode."""
    import av

    started = time.monotonic()
    size, rate, turns = transcoded_size(info, settings), output_rate(info, settings), _quarter_turns(info.rotation)
    slots = max(1, math.ceil(info.duration_s * rate - 1e-6))
    step = 1.0 / float(rate)
    encoder = _Encoder(av, size, rate, turns, settings)
    decoded, last = 0, None
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as source:
            stream = source.streams.video[0]
            stream.thread_type = "NONE"
            for frame in source.decode(stream):
                if frame.pts is None:
                    continue
                decoded += 1
                if decoded > info.frames + FRAME_SLACK:
                    raise ClipProblem(Skip.TRANSCODE_FAILED, f"the decoder yields more than the {info.frames} frames "
                                                             "the probe counted")
                if time.monotonic() - started > settings.max_seconds:
                    raise ClipProblem(Skip.TRANSCODE_FAILED, f"transcoding took over {settings.max_seconds:g} s")
                shown = float((frame.pts - info.start_pts) * frame.time_base)
                while last is not None and encoder.written < slots and encoder.written * step < shown - 1e-6:
                    encoder.write(last)
                last = frame
        while last is not None and encoder.written < slots:
            encoder.write(last)
        if last is None:
            raise ClipProblem(Skip.UNDECODABLE_VIDEO, "no frame decodes")
        return encoder.finish()
    except av.error.FFmpegError as exc:
        encoder.abort()
        raise ClipProblem(Skip.UNDECODABLE_VIDEO, f"decoding for the transcode failed: {exc}") from None
    except BaseException:
        encoder.abort()
        raise
