"""A frame list at shard time: its images read and probed from their headers, stored as one video.

`prepare_frame_list` reads each frame (within the run's image access policy), reads its format and size
from the header without decoding (`check_image(..., "none")`), and stores the files as they are in one
`K.vJ.frames.tar` member with a clip's metadata (`vlmdata.video.frame_list`). The rate is the row's
`fps` (or `sample_fps` / `frame_rate`), else `DEFAULT_FRAME_LIST_FPS`. Counted skips: an empty list
(`no_video_frames`), frames of different sizes (`mixed_frame_sizes`), a missing or unreadable frame (its
image reason: `missing_file`, `not_an_image`, `bad_image_header`, ...), more frames or seconds than the
probe limits allow (`video_too_long`), frames over `max_frame_pixels` (`decompression_bomb`), and frames
that together exceed `--max-video-bytes` (`file_too_large`).
"""
from __future__ import annotations

from collections.abc import Callable

from vlmdata.errors import RowProblem, Skip, SkipError
from vlmdata.formats.sample import EncodedVideo
from vlmdata.ingest.images import check_image
from vlmdata.ingest.video import FrameList, VideoOptions
from vlmdata.video.frame_list import FRAME_LIST_EXT, frame_list_info, pack_frames

__all__ = ["DEFAULT_FRAME_LIST_FPS", "prepare_frame_list"]

DEFAULT_FRAME_LIST_FPS = 2.0      # the rate of a frame list whose row gives none


def _check_length(n: int, fps: float, opts: VideoOptions) -> None:
    if not n:
        raise RowProblem(Skip.NO_VIDEO_FRAMES, "a frame list with no frames")
    limits = opts.limits
    if n > limits.max_frames or n / fps > limits.max_duration_s:
        raise RowProblem(Skip.VIDEO_TOO_LONG, f"{n} frames at {fps:g} fps: over {limits.max_frames} frames "
                                              f"or {limits.max_duration_s:.0f} s")


def prepare_frame_list(ref: FrameList, read: Callable[[str], bytes], opts: VideoOptions) -> EncodedVideo:
    """The frames of `ref` (each read with `read(path)`) as one stored video, or RowProblem (a counted skip)."""
    fps = ref.fps or DEFAULT_FRAME_LIST_FPS
    n = len(ref.frames)
    _check_length(n, fps, opts)
    files, kinds, size, total = [], [], None, 0
    for i, path in enumerate(ref.frames):
        try:
            data = read(path)
            kind, w, h = check_image(data, opts.limits.max_frame_pixels, "none")
        except SkipError as exc:
            raise RowProblem(exc.reason, f"frame {i} of {n} ({str(path)[:80]}): {exc}") from None
        if size is not None and (w, h) != size:
            raise RowProblem(Skip.MIXED_FRAME_SIZES, f"frame {i} of {n} is {w}x{h}, frame 0 is "
                                                     f"{size[0]}x{size[1]}")
        total += len(data)
        if total > opts.max_bytes:
            raise RowProblem(Skip.FILE_TOO_LARGE, f"{n} frames: larger than --max-video-bytes {opts.max_bytes}")
        size = (w, h)
        files.append(data)
        kinds.append(kind)
    info = frame_list_info(n, size[0], size[1], fps)
    return EncodedVideo(data=pack_frames(files, kinds), ext=FRAME_LIST_EXT, info=info.to_dict())
