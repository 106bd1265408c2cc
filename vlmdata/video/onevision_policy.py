"""LLaVA-OneVision video policy: uniform N frames, each resized to the tile, pooled 2x2 by the model.

The rules are transformers' `LlavaOnevisionVideoProcessor` (a `BaseVideoProcessor`), `LlavaOnevisionProcessor`
and `LlavaOnevisionModel.get_video_features`:

- frames: `num_frames` N sampled uniformly, indices = `np.arange(N) * frames // N` (`default_sample_indices_fn`,
  the processor's `sample_frames` with `num_frames`). The processor's own default (`do_sample_frames=False`)
  keeps every frame it is handed, which leaves the choice to the caller; vlmdata samples N frames, the
  folder's video `num_frames` when its video processor config sets one, else `DEFAULT_NUM_FRAMES` (32,
  vlmdata's choice). A clip with fewer than N frames (where transformers raises)
  takes N frames by the same formula, repeating some: every clip then has N frames, so the clips of a pack
  stack as the model's `pixel_values_videos` [videos, N, 3, S, S];
- frame size: S x S, the tile (`size` {"height", "width"}), bicubic, aspect not kept (the processor's resize);
- tokens: N * ceil(side / 2)² + 1 with side = sqrt(num_image_tokens) (`replace_video_token`: the model pools
  each frame's side x side features bilinearly to ceil(side / 2)² and appends one newline feature per video).

`fps`-based sampling (the processor's other mode) is not laid out: a folder whose video config sets `fps`
without `num_frames` gets no video layout (its video rows are `video_unsupported`), since clips would then
differ in frame count.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from vlmdata.video.layout import DecodedVideo, load_uniform, tile_rows

__all__ = ["DEFAULT_NUM_FRAMES", "OnevisionVideoPolicy"]

DEFAULT_NUM_FRAMES = 32


@dataclass(frozen=True)
class OnevisionVideoPolicy:
    """Frame sampling, size and token count of LLaVA-OneVision's video processor (module docstring).

    `tile`: the frame side in pixels; `side`: vision features per tile side (sqrt(num_image_tokens))."""

    num_frames: int = DEFAULT_NUM_FRAMES
    tile: int = 384
    side: int = 27
    patch: int = 14
    resample: int = 3

    def to_dict(self) -> dict:
        return {"kind": "llava_onevision_video", **asdict(self)}

    def frame_indices(self, frames: int, fps: float = 0.0) -> np.ndarray:
        """The positions (presentation order) of the N frames a clip takes (repeated for a short clip)."""
        return np.arange(self.num_frames, dtype=np.int64) * int(frames) // self.num_frames

    def per_frame(self) -> int:
        """Tokens one frame costs after the model's 2x2 pooling."""
        return math.ceil(self.side / 2) ** 2

    def tokens(self, frames, fps, width, height) -> np.ndarray:
        """LLM tokens per clip, N * ceil(side/2)² + 1 (vectorised; every clip takes N frames)."""
        shape = np.broadcast_shapes(np.shape(frames), np.shape(fps), np.shape(width), np.shape(height))
        return np.full(shape, self.num_frames * self.per_frame() + 1, np.int64)

    def layout(self, frames: list[np.ndarray], second_per_grid: float) -> DecodedVideo:
        """Resize the sampled (H, W, 3) uint8 frames to the tile; rows uint8 [N, 3 * S * S], channel-major."""
        rows = tile_rows(frames, self.tile, self.resample)
        grid = (len(frames), self.tile // self.patch, self.tile // self.patch)
        return DecodedVideo(rows, grid, float(second_per_grid), 1, count=len(frames) * self.per_frame() + 1)

    def load(self, data, info: dict) -> DecodedVideo:
        """Decode only the sampled frames of a stored clip and lay them out (see `VideoPolicy.load`)."""
        return load_uniform(self, data, info)
