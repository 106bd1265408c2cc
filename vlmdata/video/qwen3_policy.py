"""Qwen3-VL video policy: transformers' `Qwen3VLVideoProcessor` and `Qwen3VLProcessor` video rules.

- frames: n = min(max(int(frames / fps * target_fps), min_frames), max_frames, frames) (n may be odd);
  indices = `np.linspace(0, frames - 1, n).round()` (the processor's `sample_frames`);
- frame size: the video `smart_resize` of `video_processing_qwen3_vl` with the frame count n, temporal
  factor tp, factor patch * merge, pixels within size.shortest_edge and size.longest_edge (the latter
  summed over the n frames; with `cap_pixels_per_frame`, capped per frame as the processor does), from
  the stored (coded) width and height;
- grid (t, h, w) = (ceil(n / tp), H / patch, W / patch), the last frame repeated to fill a patch;
- text: the placeholder becomes, per temporal patch, `<{t:.1f} seconds>` + `<|vision_start|>` +
  h·w / merge² `<|video_pad|>` + `<|vision_end|>` (`replace_video_token`; t: `video.timestamps`).

A clip with one frame, where transformers' `smart_resize` raises, takes that frame, sized as for tp frames.
`fps` is the clip's measured rate (the index's `vid_fps`), as for Qwen2-VL (`video.policy`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from vlmdata.video.clip_load import load_clip
from vlmdata.video.layout import ClipLayout, DecodedVideo, flatten_video, resize_frames
from vlmdata.video.timestamps import patch_timestamps, stamp_ids, stamps_length

__all__ = ["QWEN3_VL_VIDEO", "Qwen3VideoPolicy", "smart_resize_video"]

# Qwen3VLVideoProcessor's class defaults
QWEN3_VL_VIDEO = {"fps": 2.0, "min_frames": 4, "max_frames": 768, "temporal_patch": 2, "patch": 16, "merge": 2,
                  "min_pixels": 128 * 32 * 32, "max_pixels": 32 * 32 * 768, "max_video_tokens": 768}


def smart_resize_video(num_frames: int, height: int, width: int, temporal_factor: int, factor: int,
                       min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) of the resized frames: the rule of transformers' Qwen3-VL video `smart_resize`."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class Qwen3VideoPolicy:
    """Frame sampling, size, grid and placeholder text of Qwen3-VL's video processor (module docstring).

    `timestamp_pieces`: the ids of "<", each digit, "." and " seconds>" (`video.timestamps.stamp_pieces`);
    the three token ids are the video pad and the vision start / end markers."""

    timestamp_pieces: dict
    video_token_id: int
    vision_start_id: int
    vision_end_id: int
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    temporal_patch: int = 2
    patch: int = 16
    merge: int = 2
    min_pixels: int = 128 * 32 * 32
    max_pixels: int = 32 * 32 * 768
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 768
    resample: int = 3

    def to_dict(self) -> dict:
        d = asdict(self)
        d["timestamp_pieces"] = {k: list(v) for k, v in self.timestamp_pieces.items()}
        return {"kind": "qwen3_vl_video", **d}

    @classmethod
    def from_dict(cls, d: dict) -> Qwen3VideoPolicy:
        pieces = {k: tuple(int(i) for i in v) for k, v in d["timestamp_pieces"].items()}
        return cls(**{**d, "timestamp_pieces": pieces})

    def num_frames(self, frames: int, fps: float) -> int:
        """Frames sampled from a clip of `frames` frames at `fps` (the processor's `sample_frames` count)."""
        n = int(frames / max(float(fps), 1e-9) * self.fps)
        return min(max(n, self.min_frames), self.max_frames, int(frames))

    def frame_indices(self, frames: int, fps: float) -> np.ndarray:
        """The positions (presentation order) of the frames a clip takes, as the processor picks them."""
        return np.linspace(0, frames - 1, self.num_frames(frames, fps)).round().astype(np.int64)

    def frame_size(self, n: int, width: int, height: int) -> tuple[int, int]:
        """(width, height) the n sampled frames are resized to."""
        n = max(n, self.temporal_patch)
        factor = self.patch * self.merge
        max_pixels = self.max_pixels
        if self.cap_pixels_per_frame:
            per_frame = max(min(self.max_video_tokens * factor * factor, self.max_pixels // n),
                            int(self.min_pixels * 1.05))
            max_pixels = per_frame * n
        h, w = smart_resize_video(n, int(height), int(width), self.temporal_patch, factor, self.min_pixels, max_pixels)
        return w, h

    def grid_of(self, n: int, width: int, height: int) -> tuple[int, int, int]:
        """Patch grid (t, h, w) of n frames of a width x height clip."""
        w, h = self.frame_size(n, width, height)
        return -(-n // self.temporal_patch), h // self.patch, w // self.patch

    def grid(self, frames, fps, width, height) -> np.ndarray:
        """int64 [..., 3] patch grid (t, h, w) per clip."""
        f, r, w, h = np.broadcast_arrays(frames, fps, width, height)
        cells = [self.grid_of(self.num_frames(*a[:2]), *a[2:]) for a in zip(f.ravel(), r.ravel(), w.ravel(), h.ravel())]
        return np.asarray(cells, np.int64).reshape(*f.shape, 3)

    def expansion(self, indices: np.ndarray, fps: float, grid: tuple[int, int, int]) -> np.ndarray:
        """int64 ids the clip's placeholder becomes: per temporal patch, its timestamp, vision start, the
        frame's video tokens, vision end."""
        t, h, w = grid
        frame = [self.vision_start_id] + [self.video_token_id] * (h * w // (self.merge * self.merge)) + [self.vision_end_id]
        out: list[int] = []
        for seconds in patch_timestamps(indices, float(fps), self.temporal_patch)[:t]:
            out += stamp_ids(float(seconds), self.timestamp_pieces) + frame
        return np.asarray(out, np.int64)

    def clip_tokens(self, frames: int, fps: float, width: int, height: int) -> int:
        """Tokens one clip's placeholder expands to (its expansion's length, counted without building it)."""
        indices = self.frame_indices(int(frames), float(fps))
        t, h, w = self.grid_of(len(indices), width, height)
        times = patch_timestamps(indices, float(fps), self.temporal_patch)[:t]
        return t * (h * w // (self.merge * self.merge) + 2) + stamps_length(times, self.timestamp_pieces)

    def tokens(self, frames, fps, width, height) -> np.ndarray:
        """Tokens per clip, timestamps and frame markers included (over numpy arrays, one clip at a time)."""
        f, r, w, h = np.broadcast_arrays(frames, fps, width, height)
        got = [self.clip_tokens(*a) for a in zip(f.ravel(), r.ravel(), w.ravel(), h.ravel())]
        return np.asarray(got, np.int64).reshape(f.shape)

    def second_per_grid(self, frames, fps) -> float:
        """Seconds one temporal patch spans on average (stored in the pack; the model does not read it)."""
        n = self.num_frames(frames, fps)
        return self.temporal_patch / (n / float(frames) * float(fps))

    def clip_layout(self, clip) -> ClipLayout:
        """The frames a probed clip (`ClipInfo`) takes, their size, grid and placeholder ids, from its metadata."""
        indices = self.frame_indices(clip.frames, clip.measured_fps)
        return self._layout(indices, clip.width, clip.height, clip.measured_fps, clip.frames)

    def _layout(self, indices: np.ndarray, width: int, height: int, fps: float, total: int) -> ClipLayout:
        grid = self.grid_of(len(indices), width, height)
        return ClipLayout(indices, (grid[2] * self.patch, grid[1] * self.patch), grid,
                          self.second_per_grid(total, fps), self.merge, self.expansion(indices, fps, grid))

    def frame_rows(self, frames: list[np.ndarray], layout: ClipLayout) -> np.ndarray:
        """The sampled (H, W, 3) uint8 frames resized (bicubic) and flattened."""
        return flatten_video(resize_frames(frames, *layout.size, self.resample), self.patch, self.merge,
                             self.temporal_patch)

    def layout(self, frames: list[np.ndarray], indices: np.ndarray, fps: float, total: int) -> DecodedVideo:
        """Resize the sampled (H, W, 3) uint8 frames (bicubic), flatten them and build the placeholder ids."""
        h0, w0 = frames[0].shape[:2]
        layout = self._layout(np.asarray(indices), w0, h0, fps, total)
        return layout.with_rows(self.frame_rows(frames, layout))

    def load(self, data, info: dict) -> DecodedVideo:
        """Decode only the sampled frames of a stored clip and lay them out (see `VideoPolicy.load`)."""
        return load_clip(self, data, info)
