"""Pre-extracted frames standing for one video: stored as one member, described as a clip, decoded as sampled.

A frame list (LLaVA-Video / ShareGPT4Video style: image files in order, with a frame rate) is stored as
one uncompressed tar of the frame files as they are (`pack_frames`: members `000000.jpg`, `000001.jpg`,
...). Its metadata is a `ClipInfo` like a probed clip's (`frame_list_info`): codec `FRAME_LIST_CODEC`,
every frame a keyframe at i / fps, so the index columns, the planner and each family's video policy
treat it exactly as a clip with the same frame count, rate and size. `decode_frame_list` decodes only
the sampled members (Pillow, as transformers' `load_image` leaves them: EXIF orientation applied, RGB),
found by a walk over the tar's 512-byte headers (each checksum verified) rather than `tarfile`'s member
objects: 0.9 ms for 300 members against 4.4 ms, measured.
"""
from __future__ import annotations

import io
import tarfile
from fractions import Fraction

import numpy as np

from vlmdata.errors import Skip
from vlmdata.video.probe import ClipInfo, ClipProblem

__all__ = ["FRAME_LIST_CODEC", "decode_frame_list", "frame_list_info", "pack_frames"]

FRAME_LIST_CODEC = "frames"       # the `ClipInfo.codec` of a stored frame list
FRAME_LIST_EXT = "frames.tar"     # the extension of its member: K.vJ.frames.tar


def pack_frames(frames: list[bytes], exts: list[str]) -> bytes:
    """An uncompressed tar of the frame files in order (`000000.<ext>`, ...), bytes as they are."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i, (data, ext) in enumerate(zip(frames, exts)):
            member = tarfile.TarInfo(f"{i:06d}.{ext}")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return buf.getvalue()


def frame_list_info(n_frames: int, width: int, height: int, fps: float) -> ClipInfo:
    """The clip metadata of `n_frames` frames of `width` x `height` at `fps`: frame i at i / fps."""
    time_base = Fraction(fps).limit_denominator(1_000_000) ** -1
    return ClipInfo(codec=FRAME_LIST_CODEC, width=width, height=height, rotation=0, frames=n_frames,
                    duration_s=n_frames / fps, average_fps=fps, measured_fps=fps, variable_rate=False,
                    frame_pts=np.arange(n_frames, dtype=np.int64), keyframes=np.arange(n_frames, dtype=np.int64),
                    time_base=time_base, start_pts=0)


_BLOCK = 512
_REGULAR = (b"0", b"\0")          # tar type flags of a regular file


def _checksum_ok(header: bytes) -> bool:
    """The header's stored checksum equals the sum of its bytes with the checksum field read as spaces."""
    stored = header[148:156].rstrip(b"\0 ")
    return bool(stored) and int(stored, 8) == sum(header[:148]) + 8 * 32 + sum(header[156:])


def _member_spans(data: memoryview) -> list[tuple[int, int]]:
    """(offset, size) of each regular member's bytes in an uncompressed tar, in order; ValueError when a
    header is damaged or the archive is cut short."""
    spans, at = [], 0
    while at + _BLOCK <= len(data):
        header = bytes(data[at:at + _BLOCK])
        if header.count(0) == _BLOCK:              # the end-of-archive block
            return spans
        if not _checksum_ok(header):
            raise ValueError(f"a damaged tar header at byte {at}")
        size = int(header[124:136].rstrip(b"\0 ") or b"0", 8)
        if at + _BLOCK + size > len(data):
            raise ValueError(f"the tar member at byte {at} runs past the end")
        if header[156:157] in _REGULAR:
            spans.append((at + _BLOCK, size))
        at += _BLOCK + -(-size // _BLOCK) * _BLOCK
    raise ValueError("the tar has no end-of-archive block")


def decode_frame_list(data, info: ClipInfo, indices) -> list[np.ndarray]:
    """The frames `indices` of a stored frame list (RGB uint8 arrays, in the order asked for); only those
    members are decoded. ClipProblem(undecodable_video) for a member that is missing or does not decode."""
    from vlmdata.decode.exact import processor_rgb
    from vlmdata.decode.probe import open_image

    data = memoryview(data)
    try:
        spans = _member_spans(data)
    except ValueError as exc:
        raise ClipProblem(Skip.UNDECODABLE_VIDEO, f"frame list: {exc}") from None
    if len(spans) != info.frames:
        raise ClipProblem(Skip.UNDECODABLE_VIDEO, f"{len(spans)} frame members for {info.frames} frames")
    decoded = {}
    try:
        for i in sorted({int(i) for i in indices}):
            offset, size = spans[i]
            with open_image(data[offset:offset + size]) as img:
                decoded[i] = np.asarray(processor_rgb(img))
    except (OSError, ValueError) as exc:
        raise ClipProblem(Skip.UNDECODABLE_VIDEO, f"frame list: {exc}") from None
    return [decoded[int(i)] for i in indices]
