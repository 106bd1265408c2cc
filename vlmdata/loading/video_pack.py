"""Videos in a pack: their placeholders' expansion and their pack fields.

Each clip is one `<|video_pad|>` in the stored ids, expanded to the tokens of its decoded layout
(`video.policy.DecodedVideo.tokens`, equal to the planner's count from the index): the video token
repeated, or the clip's own `expansion` ids (Qwen3-VL: timestamps and frame markers around each
temporal patch's video tokens), written over the run by `write_video_expansions`. Pack fields, present
only when the pack holds a clip:

    pixel_values_videos  uint8 [rows, 3 * tp * patch * patch]  Qwen's flattened patches, clip after clip
    video_grid           int32 [n_videos, 3]                   (t, h, w) in patches
    second_per_grid_ts   float32 [n_videos]                    seconds one temporal patch spans
    video_images_before  int32 [n_videos]                      images of the pack before each clip, in token
                                                               order (InternVL interleaves frames with tiles)
"""
from __future__ import annotations

import numpy as np

from vlmdata.loading.shared_pack import PackWriter

__all__ = ["declare_videos", "fill_videos", "images_before_clips", "pack_images_before", "video_mask", "video_repeats",
           "write_video_expansions"]


def video_mask(ids: np.ndarray, video_token_id: int | None) -> np.ndarray:
    """Where the video placeholders are (none when the family lays out no videos)."""
    if video_token_id is None:
        return np.zeros(len(ids), bool)
    return ids == video_token_id


def images_before_clips(is_img: np.ndarray, is_vid: np.ndarray) -> np.ndarray:
    """int64 per clip placeholder: the image placeholders before it (the same stored ids marked both ways)."""
    return np.cumsum(is_img, dtype=np.int64)[is_vid]


def pack_images_before(samples: list) -> np.ndarray:
    """A pack's `video_images_before` from its samples' own (`PreparedSample.video_images_before`), each offset
    by the images of the samples before it."""
    offsets = np.cumsum([0] + [len(s.images) for s in samples[:-1]])
    parts = [s.video_images_before + off for s, off in zip(samples, offsets) if len(s.videos)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def video_repeats(videos: list) -> np.ndarray:
    """Tokens each clip's placeholder expands to, int64 [n]."""
    return np.fromiter((v.tokens for v in videos), np.int64, len(videos))


def write_video_expansions(exp_ids: np.ndarray, repeats: np.ndarray, is_vid: np.ndarray, videos: list) -> None:
    """Overwrite each clip's run of repeated placeholders (`repeats` per stored id, `is_vid` marking the
    clips' placeholders) with its `expansion` ids, for clips that have one."""
    if not any(v.expansion is not None for v in videos):
        return
    starts = (np.cumsum(repeats) - repeats)[is_vid]
    for at, v in zip(starts, videos):
        if v.expansion is not None:
            exp_ids[at:at + len(v.expansion)] = v.expansion


def declare_videos(out: PackWriter, videos: list) -> None:
    """Declare the pack's video fields (nothing for a pack without clips)."""
    if not videos:
        return
    out.add("pixel_values_videos", np.uint8, (sum(len(v.rows) for v in videos), videos[0].rows.shape[1]))
    out.add("video_grid", np.int32, (len(videos), 3))
    out.add("second_per_grid_ts", np.float32, (len(videos),))
    out.add("video_images_before", np.int32, (len(videos),))


def fill_videos(arrays: dict, videos: list, images_before: np.ndarray) -> None:
    """Write the clips' rows, grids, temporal spans and places among the images into the pack's buffer."""
    if not videos:
        return
    arrays["video_images_before"][:] = images_before
    at = 0
    for i, v in enumerate(videos):
        arrays["pixel_values_videos"][at:at + len(v.rows)] = v.rows
        at += len(v.rows)
        arrays["video_grid"][i] = v.grid
        arrays["second_per_grid_ts"][i] = v.second_per_grid
