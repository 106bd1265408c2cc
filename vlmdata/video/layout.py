"""A clip laid out for a model: its frames resized (and, for Qwen-VL, flattened into the processor's patch rows)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ClipLayout", "DecodedVideo", "flatten_video", "resize_frames", "tile_rows", "video_tokens"]


def video_tokens(grid: tuple[int, int, int], merge: int, expansion: np.ndarray | None, count: int | None) -> int:
    """LLM tokens of a clip: its expansion's length, else its `count`, else t * h * w / merge²."""
    if expansion is not None:
        return len(expansion)
    if count is not None:
        return count
    t, h, w = grid
    return t * h * w // (merge * merge)


@dataclass
class DecodedVideo:
    """One clip laid out for the model: rows uint8 [t*h*w, 3*tp*patch*patch] in Qwen's patch order,
    grid (t, h, w) in patches, and the seconds one temporal patch spans. `expansion`: the token ids its
    placeholder becomes when they are not all the video token (Qwen3-VL's timestamps and frame markers);
    `count`: the video tokens when they are not t*h*w / merge² (LLaVA-OneVision: one row per frame, pooled
    features and a newline)."""

    rows: np.ndarray
    grid: tuple[int, int, int]
    second_per_grid: float
    merge: int
    expansion: np.ndarray | None = None
    count: int | None = None

    @property
    def tokens(self) -> int:
        return video_tokens(self.grid, self.merge, self.expansion, self.count)


@dataclass(frozen=True)
class ClipLayout:
    """What a clip becomes, known from its metadata before any decode: the frames it takes (presentation
    order), the (width, height) they are resized to, and every `DecodedVideo` field but its rows. A policy's
    `clip_layout(clip)` gives it and `frame_rows(frames, layout)` the rows of the decoded frames."""

    indices: np.ndarray
    size: tuple[int, int]
    grid: tuple[int, int, int]
    second_per_grid: float
    merge: int
    expansion: np.ndarray | None = None
    count: int | None = None

    @property
    def tokens(self) -> int:
        return video_tokens(self.grid, self.merge, self.expansion, self.count)

    def with_rows(self, rows: np.ndarray) -> DecodedVideo:
        """The clip laid out, once its frames' rows are made."""
        return DecodedVideo(rows, self.grid, self.second_per_grid, self.merge, self.expansion, self.count)


def resize_frames(frames: list[np.ndarray], width: int, height: int, resample: int) -> list[np.ndarray]:
    """(H, W, 3) uint8 frames resized to (width, height) with Pillow (bicubic = torch's antialiased uint8 path)."""
    from PIL import Image

    return [np.asarray(Image.fromarray(f).resize((width, height), resample)) for f in frames]


def tile_rows(frames: list[np.ndarray], tile: int, resample: int) -> np.ndarray:
    """(H, W, 3) uint8 frames resized to tile x tile (aspect not kept) -> rows uint8 [n, 3 * tile * tile],
    channel-major: one frame per row, as the tiled families' video processors give frames."""
    x = np.stack(resize_frames(frames, tile, tile, resample)).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x).reshape(len(frames), -1)


def flatten_video(frames: list[np.ndarray], patch: int, merge: int, temporal_patch: int) -> np.ndarray:
    """(H, W, 3) uint8 frames -> rows uint8 [t * gh * gw, 3 * tp * patch * patch], the processor's
    `patchify` order (merge blocks contiguous, each row (channel, frame, py, px)); the last frame is
    repeated to fill the last temporal patch."""
    pad = -len(frames) % temporal_patch
    x = np.stack(list(frames) + [frames[-1]] * pad)                  # (n, H, W, C)
    n, height, width, c = x.shape
    t, gh, gw = n // temporal_patch, height // patch, width // patch
    x = x.reshape(t, temporal_patch, gh // merge, merge, patch, gw // merge, merge, patch, c)
    x = x.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)                       # t, bh, bw, mh, mw, C, tp, py, px
    return np.ascontiguousarray(x).reshape(t * gh * gw, c * temporal_patch * patch * patch)

