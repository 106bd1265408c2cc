"""Videos in a pack: their placeholders' expansion and their pack fields.

Each clip is one `<|video_pad|>` in the stored ids, expanded to the tokens of its decoded layout
(`video.policy.DecodedVideo.tokens`, equal to the planner's count from the index): the video token
repeated, or the clip's own `expansion` ids (Qwen3-VL: timestamps and frame markers around each
temporal patch's video tokens), written over the run by `write_video_expansions`. Pack fields, present
only when the pack holds a clip:

    pixel_values_videos  uint8 [rows, 3 * tp * patch * patch]  Qwen's flattened patches, clip after clip
    video_grid           int32 [n_videos, 3]                   (t, h, w) in patches
    second_per_grid_ts   float32 [n_videos]                    seconds one temporal patch spans

With `defer_decode` (clips are `loading.video_decode.PendingVideo`) the pack holds, instead of
`pixel_values_videos`, what the training process's video stage needs to make them
(`decode.dali.video.DaliVideoStage`), with `video_grid` and `second_per_grid_ts` as above:

    video_bytes          list of uint8 arrays                  each clip's encoded file
    video_info           list of uint8 arrays                  its probe's decode window (`ClipInfo.to_dict` of
                                                               `video.frames.decode_window`: the scalars, the
                                                               times of the frames around the sampled ones and
                                                               their keyframes), JSON
    video_frames         int32 [sampled frames]                the frames its policy sampled, clip after clip
    video_frame_counts   int32 [n_videos]                      frames sampled per clip
    video_sizes          int32 [n_videos, 2]                   (width, height) those frames are resized to
    video_counts         int32 [n_samples]                     clips per sample (one per cu_seqlens segment / row)
    video_images_before  int32 [n_videos]                      images of the pack before each clip, in token
                                                               order (InternVL interleaves frames with tiles)
"""
from __future__ import annotations

import json

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


def _deferred(videos: list) -> bool:
    return hasattr(videos[0], "layout")


def _info_json(video) -> bytes:
    return json.dumps(video.info).encode()


def declare_videos(out: PackWriter, videos: list, counts) -> None:
    """Declare the pack's video fields (nothing for a pack without clips); `counts`: clips per sample."""
    if not videos:
        return
    out.add("video_grid", np.int32, (len(videos), 3))
    out.add("second_per_grid_ts", np.float32, (len(videos),))
    out.add("video_images_before", np.int32, (len(videos),))
    if not _deferred(videos):
        out.add("pixel_values_videos", np.uint8, (sum(len(v.rows) for v in videos), videos[0].rows.shape[1]))
        return
    out.add_bytes("video_bytes", [memoryview(v.data).nbytes for v in videos])
    out.add_bytes("video_info", [len(_info_json(v)) for v in videos])
    out.add("video_frames", np.int32, (sum(len(v.layout.indices) for v in videos),))
    out.add("video_frame_counts", np.int32, (len(videos),))
    out.add("video_sizes", np.int32, (len(videos), 2))
    out.add("video_counts", np.int32, (len(counts),))


def fill_videos(arrays: dict, videos: list, counts, images_before: np.ndarray) -> None:
    """Write the clips' rows (or, deferred, their bytes and sampled frames), grids, temporal spans and places
    among the pack's images (`images_before`); `counts`: clips per sample."""
    if not videos:
        return
    arrays["video_images_before"][:] = images_before
    for i, v in enumerate(videos):
        arrays["video_grid"][i] = v.grid
        arrays["second_per_grid_ts"][i] = v.second_per_grid
    if not _deferred(videos):
        at = 0
        for v in videos:
            arrays["pixel_values_videos"][at:at + len(v.rows)] = v.rows
            at += len(v.rows)
        return
    at = 0
    for i, v in enumerate(videos):
        arrays["video_bytes"][i][:] = np.frombuffer(v.data, np.uint8)
        arrays["video_info"][i][:] = np.frombuffer(_info_json(v), np.uint8)
        n = len(v.layout.indices)
        arrays["video_frames"][at:at + n] = v.layout.indices
        at += n
        arrays["video_frame_counts"][i] = n
        arrays["video_sizes"][i] = v.layout.size
    arrays["video_counts"][:] = counts
