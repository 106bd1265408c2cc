"""InternVL3 / InternVL3.5's output adapter: what `InternVLForConditionalGeneration.forward` takes.

`pixel_values` [tiles, 3, S, S]: every image's tiles (its grid row by row, then the thumbnail) in
image order, normalised as `GotOcr2ImageProcessor` does (x * 1/255 in float64, cast to float32,
then (x - mean) / std; ImageNet mean/std); `input_ids`, `labels`, `position_ids` [1, T] restarting
per packed sample; the `cu_seq_lens_*` boundaries and, for sdpa/eager, the block-diagonal causal
mask. The model takes no tile counts or image sizes: it scatters the tiles' features over the
`<IMG_CONTEXT>` tokens in order, `image_seq_length` per tile; its vision tower attends within a
tile, so tiles of different samples never meet.
"""
from __future__ import annotations

from vlmdata.hf.adapter import TiledAdapter

__all__ = ["InternVLAdapter"]


class InternVLAdapter(TiledAdapter):
    """InternVL: tiles in processor order, 1-D positions per sample (see the module docstring)."""

    family = ("internvl",)
