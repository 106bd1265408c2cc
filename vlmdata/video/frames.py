"""Decoding only the frames a sampler chose: one keyframe-started segment of packets per group of them.

`decode_frames(data, info, indices)` returns the chosen frames (RGB uint8, in the order of
`indices`) of a clip probed with `probe_clip`. The wanted frames are taken in presentation order;
each not yet decoded starts a segment at the keyframe before it. A segment's packets are fed to
the decoder one by one in decode order, and since a packet's presentation time is known before
it is decoded, each is decoded in one of three ways:

- a wanted frame: decoded in full (`skip_frame` "DEFAULT");
- any other frame before the segment's last wanted packet: `skip_frame` "NONREF", so the decoder
  drops it when no other frame refers to it (most B-frames) and decodes it when one does;
- a packet after the segment's last wanted packet: not sent at all (in decode order nothing
  before it can refer to it), nor are the packets of groups that hold no wanted frame (a seek
  skips them when that passes a whole group).

The segment ends at the next keyframe unless a wanted frame lies before that keyframe in
presentation order and after it in decode order (a leading picture of an open group, which
refers to the group before): then it runs on through that group without a reset. The leading
pictures of the keyframe a segment starts at are not sent (they refer to a group not decoded). At its end the
decoder is drained and reset (as a seek would). Frame threading is off, so `skip_frame` applies to
the very packet it is set for. Only the wanted frames are converted to RGB, with one converter per
clip. Should a wanted frame still not come out (a container whose packet and frame times differ),
its segment is decoded again from the keyframe before, every packet in full, then from the start,
so the frames returned are always exactly those a full decode has at those positions (else
ClipProblem undecodable_video). `decode_window(info, indices)` is the part of `info` that decoding
`indices` looks up, what a deferred pack ships instead of every frame's time. A stored
frame list (`vlmdata.video.frame_list`, codec "frames") is read by decoding only its sampled
image members.
"""
from __future__ import annotations

import io
from dataclasses import replace

import numpy as np

from vlmdata.errors import Skip
from vlmdata.video.frame_list import FRAME_LIST_CODEC, decode_frame_list
from vlmdata.video.probe import ClipInfo, ClipProblem

__all__ = ["decode_frames", "decode_window"]


class _Reader:
    """One open clip: demuxes packets in decode order (with one packet of look-ahead), seeks to keyframes,
    and feeds packets to the decoder in the way asked."""

    def __init__(self, data: bytes, info: ClipInfo):
        import av
        from av.video.reformatter import VideoReformatter

        self._av = av
        self.info = info
        self.container = av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
        self.stream = self.container.streams.video[0]
        self.stream.thread_type = "NONE"           # no frame threading: skip_frame applies per packet
        self.codec = self.stream.codec_context
        self.to_rgb = VideoReformatter()
        self.index_of = _Positions(info)
        self.packets = None
        self.ahead = None                          # a packet demuxed but not yet used
        self.skip_mode = "DEFAULT"
        self.decoded = self.seeks = self.sent = self.retries = 0

    def seek(self, keyframe: int) -> None:
        """Position the demuxer at or before keyframe `keyframe` (the start for keyframe 0)."""
        pts = self.info.pts_of(keyframe) if keyframe > 0 else self.info.start_pts
        self.container.seek(pts, backward=True, any_frame=False, stream=self.stream)
        self.packets, self.ahead = None, None
        self.seeks += 1

    def next_packet(self):
        """The next packet in decode order (the flush packet excluded), or None at the end."""
        if self.ahead is not None:
            packet, self.ahead = self.ahead, None
            return packet
        if self.packets is None:
            self.packets = self.container.demux(self.stream)
        for packet in self.packets:
            if packet.size or packet.pts is not None:
                return packet
        return None

    def put_back(self, packet) -> None:
        self.ahead = packet

    def decode(self, packet, skip_unreferenced: bool) -> list:
        """Decoded frames the decoder gives back for `packet` (None: drain it), after setting skip_frame."""
        mode = "NONREF" if skip_unreferenced else "DEFAULT"
        if mode != self.skip_mode:
            self.codec.skip_frame = mode
            self.skip_mode = mode
        if packet is not None:
            self.sent += 1
        frames = self.codec.decode(packet)
        self.decoded += len(frames)
        return frames

    def reset(self) -> None:
        """Forget the decoder's state (after draining it), as a seek does."""
        self.codec.flush_buffers()

    def rgb(self, frame) -> np.ndarray:
        return self.to_rgb.reformat(frame, format="rgb24").to_ndarray()

    def close(self) -> None:
        self.container.close()


def _keyframe_at_or_before(info: ClipInfo, index: int) -> int:
    at = int(np.searchsorted(info.keyframes, index, side="right")) - 1
    return int(info.keyframes[at]) if at >= 0 else 0


def _keyframe_after(info: ClipInfo, index: int) -> int:
    """The first keyframe after frame `index` (the frame count when there is none)."""
    at = int(np.searchsorted(info.keyframes, index, side="right"))
    return int(info.keyframes[at]) if at < len(info.keyframes) else info.frames


def _keyframe_before(info: ClipInfo, keyframe: int) -> int:
    """The keyframe before keyframe `keyframe` (0 for the first)."""
    return _keyframe_at_or_before(info, keyframe - 1) if keyframe > 0 else 0


def _keyframes_around(info: ClipInfo, index: int) -> list[int]:
    """The keyframes decoding frame `index` may look up (see `decode_window`)."""
    k0 = _keyframe_at_or_before(info, index)
    k1 = _keyframe_before(info, k0)
    out = [_keyframe_before(info, k1), k1, k0]
    for _ in range(3):
        out.append(_keyframe_after(info, max(out[-1], index)))
    return [k for k in out if k < info.frames]


def decode_window(info: ClipInfo, indices) -> ClipInfo:
    """The part of a whole clip's `info` that `decode_frames(data, window, indices)` looks up, for a clip
    shipped to be decoded elsewhere: its size is bounded by the frames sampled, not by the clip's length.

    It holds the scalars and the times of frame 0 (the last retry's start), of the sampled frames, and of
    these keyframes around each: its own, the two before (the retry's start, and the group holding that
    start's leading pictures) and the three after (the segment's end, and two more groups a segment may
    run on through). The decoder places any other packet between the held frames (`_Positions`), where it
    compares with all of them as in the whole info, so the decode is the whole info's as long as a frame's
    packet comes at most two groups after its own in decode order (reordering spans a few frames)."""
    if info.pts_frames is not None:
        return info
    wanted = {int(i) for i in indices}
    keyframes = np.unique([k for i in wanted for k in _keyframes_around(info, i)]).astype(np.int64)
    keyframes = keyframes[np.isin(keyframes, info.keyframes)]
    frames = np.union1d(np.union1d([0], list(wanted)), keyframes).astype(np.int64)
    return replace(info, frame_pts=info.frame_pts[frames], keyframes=keyframes, pts_frames=frames)


class _Positions:
    """The frame position of a packet's or a frame's pts: its index where the info holds its time; in a decode
    window, for another time between held frames a and b, a + 0.5 (it compares as the frame there does with
    every keyframe and sampled frame the window holds); None for no time, or one before frame 0. (Every
    packet's time is a probed frame's: the probe demuxed them all.)"""

    def __init__(self, info: ClipInfo):
        self.exact = info.frame_by_pts()
        self.window = info.pts_frames is not None
        if self.window:
            self.pts, self.frames = info.frame_pts + info.start_pts, info.pts_frames

    def get(self, pts):
        index = self.exact.get(pts)
        if index is not None or not self.window or pts is None:
            return index
        before = int(np.searchsorted(self.pts, pts)) - 1
        return None if before < 0 else int(self.frames[before]) + 0.5


class _Segment:
    """The wanted frames one decoder run from keyframe `start` must produce: those in [start, end), where
    `end` is the keyframe after frame `through` (the group holding it is the segment's last)."""

    def __init__(self, info: ClipInfo, start: int, through: int, out: dict, full: bool):
        self.info, self.start, self.out, self.full = info, start, out, full
        self.end = _keyframe_after(info, through)
        self.unsent = {i for i in out if start <= i < self.end and out[i] is None}

    def extend(self) -> None:
        """Run on through the next group (without a reset): its wanted frames join the segment."""
        following = _keyframe_after(self.info, self.end)
        self.unsent |= {i for i in self.out if self.end <= i < following and self.out[i] is None}
        self.end = following


def _find(reader: _Reader, keyframe: int) -> bool:
    """Demux forward to the keyframe packet of frame `keyframe` and leave it as the next packet (for frame 0:
    the first packet). False when the demuxer is already past it."""
    target = reader.info.pts_of(keyframe)
    while (packet := reader.next_packet()) is not None:
        if keyframe == 0 or (packet.is_keyframe and packet.pts == target):
            reader.put_back(packet)
            return True
        if packet.is_keyframe and packet.pts is not None and packet.pts > target:
            return False
    return False


def _position(reader: _Reader, keyframe: int) -> bool:
    """Make the keyframe packet of frame `keyframe` the next packet: demux forward when the next packet
    is that one or lies in the group just before it, else seek (and from the start, should the seek land
    past it: an inexact index). False when it is not found at all."""
    packet = reader.next_packet()
    if packet is not None:
        reader.put_back(packet)
        index = reader.index_of.get(packet.pts)
        at_it = index == keyframe and (packet.is_keyframe or keyframe == 0)
        before_it = index is not None and index < keyframe and _keyframe_after(reader.info, index) == keyframe
        if (at_it or before_it) and _find(reader, keyframe):
            return True
    for start in dict.fromkeys((keyframe, 0)):
        reader.seek(start)
        if _find(reader, keyframe):
            return True
    return False


def _collect(reader: _Reader, frames: list, out: dict) -> None:
    for frame in frames:
        index = reader.index_of.get(frame.pts)
        if index in out and out[index] is None:
            out[index] = reader.rgb(frame)


def _run(reader: _Reader, segment: _Segment) -> None:
    """Feed the segment's packets from its keyframe on (the next packet), then drain and reset the decoder.

    In a `full` segment every packet up to the last wanted one is decoded in full; otherwise as the
    module describes."""
    while segment.unsent:
        packet = reader.next_packet()
        if packet is None:
            break
        index = reader.index_of.get(packet.pts)
        if index is not None and packet.is_keyframe and index >= segment.end:
            if not any(i < segment.end for i in segment.unsent):
                reader.put_back(packet)        # the next group starts afresh: leave its keyframe for it
                break
            segment.extend()                   # wanted leading pictures refer to this group: run on
        if index is not None and index < segment.start:
            continue                           # a leading picture of the start keyframe: refers to the group before
        segment.unsent.discard(index)
        wanted = index in segment.out and segment.out[index] is None
        _collect(reader, reader.decode(packet, skip_unreferenced=not (wanted or segment.full)), segment.out)
    _collect(reader, reader.decode(None, skip_unreferenced=False), segment.out)
    reader.reset()


def _fetch(reader: _Reader, target: int, out: dict) -> None:
    """Decode the segment holding frame `target`; should `target` not come out, again from the keyframe
    before, every packet in full, then from the start."""
    info = reader.info
    keyframe = _keyframe_at_or_before(info, target)
    earlier = _keyframe_before(info, keyframe)
    for attempt, (start, full) in enumerate(dict.fromkeys(((keyframe, False), (earlier, True), (0, True)))):
        reader.retries += attempt > 0
        if _position(reader, start):
            _run(reader, _Segment(info, start, target, out, full))
        if out[target] is not None:
            return
    raise ClipProblem(Skip.UNDECODABLE_VIDEO, f"frame {target} of {info.frames} did not decode")


def decode_frames(data: bytes, info: ClipInfo, indices, stats: dict | None = None) -> list[np.ndarray]:
    """The frames `indices` (presentation order positions) of the clip, as RGB uint8 arrays.

    `stats`, when given, receives how many frames the decoder output (`decoded`), how many packets
    it was sent (`sent`), how many seeks it took (`seeks`) and how many segments had to be decoded
    again in full (`retries`)."""
    wanted = sorted({int(i) for i in indices})
    if wanted and (wanted[0] < 0 or wanted[-1] >= info.frames):
        raise IndexError(f"frame indices must be in [0, {info.frames}); got {wanted[0]}..{wanted[-1]}")
    if info.codec == FRAME_LIST_CODEC:
        if stats is not None:
            stats.update(decoded=len(wanted), sent=len(wanted), seeks=0, retries=0)
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
            stats.update(decoded=reader.decoded, sent=reader.sent, seeks=reader.seeks, retries=reader.retries)
        reader.close()
    return [out[int(i)] for i in indices]
