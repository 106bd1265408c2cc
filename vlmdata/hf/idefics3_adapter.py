"""The Idefics3 / SmolVLM output adapter: what `Idefics3ForConditionalGeneration` and
`SmolVLMForConditionalGeneration` take.

A pack's tiles (every image's row-major tiles, then its global image; `decode.tiling.idefics3`) become
`pixel_values` [1, N, 3, S, S], normalised as the processor does ((x/255 - mean) / std in float32), and
`pixel_attention_mask` [1, N, S, S] (all true: every tile is a full S x S crop, so the processor's batch
padding never pads a tile). The model flattens batch and image axes, so one row of N tiles serves a pack
of many samples: the image features fill the `<image>` tokens in order. Positions are 1-D, restarting per
sample; the boundaries travel as for every family (`cu_seq_lens_*`, the block mask for sdpa/eager).
"""
from __future__ import annotations

import torch

from vlmdata.hf.adapter import TiledAdapter

__all__ = ["Idefics3Adapter"]


class Idefics3Adapter(TiledAdapter):
    """Idefics3 and SmolVLM: tiles as [1, N, 3, S, S] with their pixel_attention_mask."""

    family = ("idefics3", "smolvlm")

    def normalise(self, pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return super().normalise(pixels, dtype).unsqueeze(0)

    def finalize(self, batch: dict, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> dict:
        inputs = super().finalize(batch, device, dtype)
        pixels = inputs.get("pixel_values")
        if pixels is not None:
            n, side = pixels.shape[1], pixels.shape[-1]
            inputs["pixel_attention_mask"] = torch.ones((1, n, side, side), dtype=torch.bool, device=pixels.device)
        return inputs
