"""Decoding only the frames a sampler chose, by seeking to the keyframe before each of them.

`decode_frames(data, info, indices)` returns the chosen frames (RGB uint8, in the order of
`indices`) of a clip probed with `probe_clip`. It walks the wanted frames in presentation
order and, for each, decides from the clip's keyframe positions whether to keep decoding
forward (the next wanted frame lies before the next keyframe) or to seek to the keyframe
that precedes it, so a clip sampled at 2 fps decodes about one GOP per sampled frame
instead of every frame. A seek that lands past its target (a container with an inexact
index) falls back to the previous keyframe, then to the start, so the frames returned are
always exactly the ones asked for. A stored frame list (`vlmdata.video.frame_list`, codec "frames") is
read by decoding only its sampled image members.
"""
from __future__ import annotations

import io

import numpy as np

from vlmdata.errors import Skip
from vlmdata.video.frame_list import FRAME_LIST_CODEC, decode_frame_list
from vlmdata.video.probe import ClipInfo, ClipProblem

__all__ = ["decode_frames"]

# A seek (flush, re-read, decoder priming) costs about as much as decoding a few frames: seek only when
# it skips more frames than that.
SEEK_SAVES = 4
# Frames nothing else refers to (most B-frames) are not decoded while the next wanted frame is further
# ahead than this (a common B-frame run plus the decoder's reordering delay; should a wanted frame be
# dropped all the same, the frame is fetched again by a seek and a full decode).
SKIP_MARGIN = 6


class _Reader:
    """One open clip: decodes forward, seeks to keyframes, knows which frame it decoded last."""

    def __init__(self, data: bytes, info: ClipInfo):
        import av

        self._av = av
        self.info = info
        self.container = av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
        self.stream = self.container.streams.video[0]
        self.stream.thread_type = "NONE"
        self.index_of = {int(p) + info.start_pts: i for i, p in enumerate(info.frame_pts)}
        self.frames = None
        self.last = -1                # index of the last frame decoded (-1: at the start)
        self.decoded = self.seeks = 0
        self.skipping = False

    def skip_unreferenced(self, on: bool) -> None:
        """Let the decoder drop frames no other frame refers to (or stop it doing so)."""
        if on != self.skipping:
            self.stream.codec_context.skip_frame = "NONREF" if on else "DEFAULT"
            self.skipping = on

    def seek(self, keyframe: int) -> None:
        if keyframe <= 0:
            self.container.seek(0, backward=True, any_frame=False, stream=self.stream)
        else:
            self.container.seek(self.info.pts_of(keyframe), backward=True, any_frame=False, stream=self.stream)
        self.frames = None
        self.last = -1
        self.seeks += 1

    def next_frame(self):
        """(index, frame) of the next decoded frame, or None at the end of the stream."""
        if self.frames is None:
            self.frames = self.container.decode(self.stream)
        for frame in self.frames:
            self.decoded += 1
            index = self.index_of.get(frame.pts)
            if index is not None:
                self.last = index
                return index, frame
        return None

    def close(self) -> None:
        self.container.close()


def _keyframe_before(info: ClipInfo, index: int) -> int:
    at = int(np.searchsorted(info.keyframes, index, side="right")) - 1
    return int(info.keyframes[at]) if at >= 0 else 0


def _decode_until(reader: _Reader, target: int, out: dict, skip: bool) -> None:
    """Decode forward to frame `target` (or the end), keeping every wanted frame met on the way.

    With `skip`, unreferenced frames are dropped while `target` (the first wanted frame not yet decoded)
    is more than SKIP_MARGIN frames away."""
    while True:
        reader.skip_unreferenced(skip and target - reader.last > SKIP_MARGIN)
        got = reader.next_frame()
        if got is None:
            return
        index, frame = got
        if index in out and out[index] is None:
            out[index] = frame.to_ndarray(format="rgb24")
        if index >= target:
            return


def _fetch(reader: _Reader, target: int, out: dict) -> None:
    """Get frame `target` into `out` (index -> frame), seeking only when decoding forward costs more."""
    info = reader.info
    keyframe = _keyframe_before(info, target)
    starts = (keyframe, _keyframe_before(info, keyframe - 1) if keyframe > 0 else 0, 0)
    must_seek = reader.last >= target or keyframe - reader.last > SEEK_SAVES
    for attempt, start in enumerate(starts):
        if must_seek or attempt:
            reader.seek(start)
        _decode_until(reader, target, out, skip=attempt == 0)
        if out[target] is not None:
            return
    raise ClipProblem(Skip.UNDECODABLE_VIDEO, f"frame {target} of {info.frames} did not decode")


def decode_frames(data: bytes, info: ClipInfo, indices, stats: dict | None = None) -> list[np.ndarray]:
    """The frames `indices` (presentation order positions) of the clip, as RGB uint8 arrays.

    `stats`, when given, receives how many frames were decoded and how many seeks it took."""
    wanted = sorted({int(i) for i in indices})
    if wanted and (wanted[0] < 0 or wanted[-1] >= info.frames):
        raise IndexError(f"frame indices must be in [0, {info.frames}); got {wanted[0]}..{wanted[-1]}")
    if info.codec == FRAME_LIST_CODEC:
        if stats is not None:
            stats.update(decoded=len(wanted), seeks=0)
        return decode_frame_list(data, info, indices)
    out: dict[int, np.ndarray | None] = dict.fromkeys(wanted)
    reader = _Reader(data, info)
    try:
        for target in wanted:
            if out[target] is None:
                _fetch(reader, target, out)
    except reader._av.error.FFmpegError as exc:
        raise ClipProblem(Skip.UNDECODABLE_VIDEO, f"decoding failed: {exc}") from None
    finally:
        if stats is not None:
            stats.update(decoded=reader.decoded, seeks=reader.seeks)
        reader.close()
    return [out[int(i)] for i in indices]
