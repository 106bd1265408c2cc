"""Video clips made at test time with PyAV (FFmpeg's encoders): codecs, rates, sizes, rotations, VFR.

`make_clip(ClipSpec(...))` returns the encoded bytes. Frame i shows a moving gradient
whose colour encodes i, so a test can tell decoded frames apart.
"""
from __future__ import annotations

import io
import os
import tempfile
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

__all__ = ["ClipSpec", "make_clip"]

CONTAINERS = {"mp4": "mp4", "mov": "mov", "mkv": "matroska", "webm": "webm"}


@dataclass(frozen=True)
class ClipSpec:
    container: str = "mp4"          # mp4, mov, mkv, webm
    codec: str = "libx264"          # libx264, libvpx-vp9, mpeg4, ...
    width: int = 96
    height: int = 64
    fps: int = 30
    frames: int = 60
    gop: int = 12                   # frames between keyframes
    rotation: int = 0               # display rotation, counter-clockwise degrees
    variable_rate: bool = False     # irregular frame times (each frame lasts 1-3 ticks of 1/fps)
    audio: bool = False             # add an AAC audio track (at least 1 s long)
    video: bool = True              # False: audio only
    faststart: bool = False         # mp4/mov: the index (moov) before the frames, as streaming sites serve it
    encoder_options: tuple[tuple[str, str], ...] = ()   # extra encoder options, e.g. (("bf", "2"),) for mpeg4 B-frames


def frame_pixels(i: int, width: int, height: int) -> np.ndarray:
    """Frame i's RGB pixels: a gradient shifted by i, in colours that encode i."""
    y, x = np.mgrid[0:height, 0:width]
    r = (x * 255 // max(width - 1, 1) + 7 * i) % 256
    g = (y * 255 // max(height - 1, 1) + 3 * i) % 256
    b = np.full_like(x, (37 * i) % 256)
    return np.stack([r, g, b], -1).astype(np.uint8)


def _add_audio(container):
    stream = container.add_stream("aac", rate=16000)
    stream.layout = "mono"
    return stream


def _encode_audio(container, stream, seconds: float) -> None:
    import av

    samples = int(16000 * seconds)
    t = np.arange(samples, dtype=np.float32) / 16000
    tone = (0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None, :]
    frame_size = stream.codec_context.frame_size or 1024
    for start in range(0, samples, frame_size):
        chunk = tone[:, start:start + frame_size]
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(chunk), format="fltp", layout="mono")
        frame.sample_rate, frame.pts = 16000, start
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def _encoder_options(spec: ClipSpec) -> dict[str, str]:
    """The encoder's options: a keyframe every `gop` frames exactly (x264, x265), then the spec's own."""
    base = {"libx264": {"g": str(spec.gop), "keyint_min": str(spec.gop)},
            "libx265": {"x265-params": f"keyint={spec.gop}:min-keyint={spec.gop}:log-level=error"}}
    return {**base.get(spec.codec, {}), **dict(spec.encoder_options)}


def make_clip(spec: ClipSpec = ClipSpec(), seed: int = 0) -> bytes:
    """Encode the clip `spec` describes; returns the container's bytes."""
    if spec.faststart:                      # the muxer rewrites the file to move its index: a real file
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "clip." + spec.container)
            _encode(path, spec, seed, {"movflags": "faststart"})
            with open(path, "rb") as f:
                return f.read()
    buf = io.BytesIO()
    _encode(buf, spec, seed, {})
    return buf.getvalue()


def _encode(target, spec: ClipSpec, seed: int, options: dict) -> None:
    import av

    rng = np.random.default_rng(seed)
    with av.open(target, mode="w", format=CONTAINERS[spec.container], options=options) as container:
        audio = _add_audio(container) if spec.audio or not spec.video else None
        if spec.video:
            stream = container.add_stream(spec.codec, rate=spec.fps)
            stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, "yuv420p"
            stream.codec_context.gop_size = spec.gop
            stream.options = _encoder_options(spec)
            if spec.variable_rate:
                stream.codec_context.time_base = Fraction(1, spec.fps)
            if spec.rotation:
                stream.set_display_rotation(spec.rotation)
            tick = 0
            for i in range(spec.frames):
                frame = av.VideoFrame.from_ndarray(frame_pixels(i, spec.width, spec.height), format="rgb24")
                if spec.variable_rate:
                    frame.pts, frame.time_base = tick, Fraction(1, spec.fps)
                    tick += int(rng.integers(1, 4))
                for packet in stream.encode(frame):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        if audio is not None:
            _encode_audio(container, audio, max(spec.frames / spec.fps, 1.0))
