"""InternVL video policy: N frames sampled from the middle of equal spans, each one tile, `Frame{i}:` before each.

The rules are transformers' `InternVLVideoProcessor` and `InternVLProcessor.replace_video_token`:

- frames: `num_frames` N; indices = `torch.arange(shift, frames, frames / N).int()` with shift = frames / N / 2
  (`initial_shift=True`, the processor's default: the middle of each span), the processor's `sample_frames`.
  A clip with fewer than N frames (where transformers raises) takes N frames by the same formula, repeating
  some, so every clip of a dataset costs the same tokens;
- frame size: S x S (`size`), bicubic, aspect not kept; one tile per frame, no thumbnail;
- text: the placeholder becomes `"\\n".join(f"Frame{i + 1}: <img>" + "<IMG_CONTEXT>" * per_tile + "</img>")`
  over the N frames; the model takes the frames as image tiles (`pixel_values`), in token order with the
  sample's images.

`prefix_ids[i]`: the ids of frame i's text before its `<img>` ("Frame1: ", then "\\nFrame2: ", ...), as the
tokenizer splits them between the special tokens; the family tokenizes them once.

How the InternVL family stores a clip (`text.families.internvl`): "Frame1: " follows the text before the
placeholder in the processor's string, so a byte-level BPE may merge across that boundary; the family
therefore tokenizes "Frame1: " with the text before it (as the processor's whole string is tokenized) and
stores one placeholder id right after it, where the processor has frame 1's `<img>`. That id becomes
`placeholder_ids()`: the replacement without "Frame1: ", from frame 1's `<img>` to frame N's `</img>`;
`tokens` counts those. The clips' frames reach `pixel_values` between the images' tiles in token order
(the pack's `video_images_before`, `loading.video_pack`; `hf.adapter.InternVLAdapter`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from vlmdata.video.clip_load import load_clip
from vlmdata.video.layout import ClipLayout, DecodedVideo, tile_rows

__all__ = ["DEFAULT_NUM_FRAMES", "InternVLVideoPolicy", "frame_prefix_texts"]

DEFAULT_NUM_FRAMES = 8          # vlmdata's choice when the folder's video config sets no num_frames


def frame_prefix_texts(n: int) -> list[str]:
    """The text before each frame's `<img>` in the processor's replacement: "Frame1: ", "\\nFrame2: ", ..."""
    return [("\n" if i else "") + f"Frame{i + 1}: " for i in range(n)]


@dataclass(frozen=True)
class InternVLVideoPolicy:
    """Frame sampling, tile size and placeholder ids of InternVL's video processor (module docstring)."""

    prefix_ids: tuple
    image_token_id: int
    start_id: int
    end_id: int
    per_tile: int = 256
    tile: int = 448
    resample: int = 3

    @property
    def num_frames(self) -> int:
        return len(self.prefix_ids)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["prefix_ids"] = [list(p) for p in self.prefix_ids]
        return {"kind": "internvl_video", **d}

    @classmethod
    def from_dict(cls, d: dict) -> InternVLVideoPolicy:
        return cls(**{**d, "prefix_ids": tuple(tuple(int(i) for i in p) for p in d["prefix_ids"])})

    def frame_indices(self, frames: int, fps: float = 0.0) -> np.ndarray:
        """The positions of the frames a clip takes: the middle of N equal spans (repeated for a short clip)."""
        import torch

        n = self.num_frames
        picked = torch.arange(frames / n / 2, frames, frames / n).int().numpy().astype(np.int64)   # the processor's op
        return picked[:n]

    def expansion(self) -> np.ndarray:
        """int64 ids the placeholder becomes (the same for every clip: N frames of one tile)."""
        out: list[int] = []
        for prefix in self.prefix_ids:
            out += list(prefix) + [self.start_id] + [self.image_token_id] * self.per_tile + [self.end_id]
        return np.asarray(out, np.int64)

    def placeholder_ids(self) -> np.ndarray:
        """int64 ids the stored placeholder becomes: the expansion after frame 1's "Frame1: " (which the family
        tokenizes with the text before it)."""
        return self.expansion()[len(self.prefix_ids[0]):]

    def tokens(self, frames, fps, width, height) -> np.ndarray:
        """Tokens per clip: `placeholder_ids()`'s length (vectorised; every clip takes N frames)."""
        shape = np.broadcast_shapes(np.shape(frames), np.shape(fps), np.shape(width), np.shape(height))
        per = sum(len(p) for p in self.prefix_ids[1:]) + self.num_frames * (self.per_tile + 2)
        return np.full(shape, per, np.int64)

    def clip_layout(self, clip) -> ClipLayout:
        """The N frames a probed clip (`ClipInfo`) takes and the tile they are resized to, from its metadata."""
        span = clip.frames / max(clip.measured_fps, 1e-9) / self.num_frames     # seconds between samples
        return self._layout(self.frame_indices(clip.frames), span)

    def _layout(self, indices: np.ndarray, second_per_grid: float) -> ClipLayout:
        return ClipLayout(indices, (self.tile, self.tile), (len(indices), 1, 1), float(second_per_grid), 1,
                          self.placeholder_ids())

    def frame_rows(self, frames: list[np.ndarray], layout: ClipLayout) -> np.ndarray:
        """The sampled (H, W, 3) uint8 frames resized to the tile; rows uint8 [N, 3 * S * S], channel-major."""
        return tile_rows(frames, self.tile, self.resample)

    def layout(self, frames: list[np.ndarray], second_per_grid: float) -> DecodedVideo:
        """Resize the sampled (H, W, 3) uint8 frames to the tile; rows uint8 [N, 3 * S * S], channel-major."""
        layout = self._layout(np.arange(len(frames)), second_per_grid)
        return layout.with_rows(self.frame_rows(frames, layout))

    def load(self, data, info: dict) -> DecodedVideo:
        """Decode only the sampled frames of a stored clip and lay them out (see `VideoPolicy.load`)."""
        return load_clip(self, data, info)
