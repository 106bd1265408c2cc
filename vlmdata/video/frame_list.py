"""Pre-extracted frames standing for one video: stored as one member, described as a clip, decoded as sampled.

A frame list (LLaVA-Video / ShareGPT4Video style: image files in order, with a frame rate) is stored as
one uncompressed tar of the frame files as they are (`pack_frames`: members `000000.jpg`, `000001.jpg`,
...). Its metadata is a `ClipInfo` like a probed clip's (`frame_list_info`): codec `FRAME_LIST_CODEC`,
every frame a keyframe at i / fps, so the index columns, the planner and each family's video policy
treat it exactly as a clip with the same frame count, rate and size. `decode_frame_list` decodes only
the sampled members (Pillow, as transformers' `load_image` leaves them: EXIF orientation applied, RGB).
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


def decode_frame_list(data, info: ClipInfo, indices) -> list[np.ndarray]:
    """The frames `indices` of a stored frame list (RGB uint8 arrays, in the order asked for); only those
    members are decoded. ClipProblem(undecodable_video) for a member that is missing or does not decode."""
    from vlmdata.decode.exact import processor_rgb
    from vlmdata.decode.probe import open_image

    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
            if len(members) != info.frames:
                raise ClipProblem(Skip.UNDECODABLE_VIDEO, f"{len(members)} frame members for {info.frames} frames")
            decoded = {}
            for i in sorted({int(i) for i in indices}):
                with open_image(tar.extractfile(members[i]).read()) as img:
                    decoded[i] = np.asarray(processor_rgb(img))
    except (tarfile.TarError, OSError, ValueError, IndexError) as exc:
        raise ClipProblem(Skip.UNDECODABLE_VIDEO, f"frame list: {exc}") from None
    return [decoded[int(i)] for i in indices]
