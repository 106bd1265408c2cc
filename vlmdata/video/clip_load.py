"""Loading one stored clip for a model: the frames its policy samples, decoded and laid out.

`load_clip(policy, data, info)` reads the policy's `clip_layout` (from the probe dict alone), decodes only
those frames (`video.frames.decode_frames`, PyAV seeking, unless `decode` is given: the deferred decode
stage passes its own) and makes the rows with the policy's `frame_rows`. The decoded frames are freed
once the rows exist.
"""
from __future__ import annotations

from vlmdata.video.layout import DecodedVideo
from vlmdata.video.probe import ClipInfo

__all__ = ["load_clip"]


def load_clip(policy, data, info: dict, decode=None) -> DecodedVideo:
    """The clip laid out by `policy`; ClipProblem / ValueError for a clip that does not decode.

    `decode(data, clip, indices) -> list of (H, W, 3) uint8 frames` (default: `decode_frames`)."""
    if decode is None:
        from vlmdata.video.frames import decode_frames as decode
    clip = ClipInfo.from_dict(info)
    layout = policy.clip_layout(clip)
    frames = decode(data, clip, layout.indices)
    try:
        return layout.with_rows(policy.frame_rows(frames, layout))
    finally:
        del frames
