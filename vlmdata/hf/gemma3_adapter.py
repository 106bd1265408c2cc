"""Gemma 3's output adapter: one normalised 896 px image per `<start_of_image>` run, `token_type_ids`, and
packed masks that do what Gemma3Model does for each sample alone.

Gemma3Model (transformers 5.24) builds, from `token_type_ids` (1 on `<image_soft_token>`), one mask per
layer type: full-attention layers attend causally OR bidirectionally inside each image's run of soft
tokens (`blockwise_overlay`); sliding-window layers take that AND `kv > q - sliding_window`. A 4-D
`attention_mask` would be used as is for BOTH layer types (dropping the sliding window), and the
position-ids packing detection it falls back to without a mask indexes the image blocks by the
restarted positions on the sliding layers. So for sdpa/eager a pack gets `attention_mask` as the mapping
`{"full_attention": ..., "sliding_attention": ...}` (which the model takes as its mask mapping), each
[1, 1, T, T], closed across samples. Flash-attention implementations are refused: they drop the
bidirectional image attention (transformers marks Gemma 3 `_supports_flash_attn = False`).
"""
from __future__ import annotations

import torch

from vlmdata.errors import AdapterError
from vlmdata.hf.adapter import TiledAdapter
from vlmdata.hf.boundaries import MASKED

__all__ = ["Gemma3Adapter", "gemma3_packed_masks"]


def _image_blocks(image: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
    """Per token: the index of its run of image tokens (a run ends at a sample boundary), -1 for text."""
    prev_image = torch.nn.functional.pad(image, (1, 0))[:-1]
    prev_seg = torch.nn.functional.pad(seg, (1, 0), value=-1)[:-1]
    starts = image & (~prev_image | (prev_seg != seg))
    return torch.where(image, torch.cumsum(starts.to(torch.int64), 0) - 1, -1)


def gemma3_packed_masks(cu_seqlens: torch.Tensor, token_type_ids: torch.Tensor, sliding_window: int,
                        additive_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """{"full_attention", "sliding_attention"} [1, 1, T, T] masks of a pack (True / 0 = attend): within a
    sample, causal or inside the same image's run; the sliding one also needs kv > q - sliding_window."""
    types = token_type_ids.reshape(-1)
    cu = cu_seqlens.to(device=types.device, dtype=torch.int64)
    total = types.shape[0]
    seg = torch.repeat_interleave(torch.arange(len(cu) - 1, device=types.device), cu[1:] - cu[:-1],
                                  output_size=total)
    block = _image_blocks(types == 1, seg)
    pos = torch.arange(total, device=types.device)
    same = seg[:, None] == seg[None, :]
    bidirectional = (block[:, None] == block[None, :]) & (block[:, None] >= 0)
    full = same & ((pos[None, :] <= pos[:, None]) | bidirectional)
    sliding = full & (pos[None, :] > pos[:, None] - int(sliding_window))
    masks = {"full_attention": full[None, None], "sliding_attention": sliding[None, None]}
    if additive_dtype is None:
        return masks
    zero = torch.zeros((), dtype=additive_dtype, device=types.device)
    return {k: torch.where(m, zero, torch.finfo(additive_dtype).min) for k, m in masks.items()}


class Gemma3Adapter(TiledAdapter):
    """Gemma3ForConditionalGeneration: `pixel_values` [n, 3, S, S], `token_type_ids` (the processor's: 1 on
    soft tokens), 1-D positions per sample, per-layer-type packed masks (sdpa, eager)."""

    family = ("gemma3",)

    def __init__(self, spec, attn_implementation: str = "sdpa"):
        super().__init__(spec, attn_implementation)
        if self.kind != MASKED:
            raise AdapterError(f"Gemma 3 attends bidirectionally inside each image, which {attn_implementation} "
                               "drops (transformers does not support flash attention for Gemma 3): use sdpa or "
                               "eager")

    def __call__(self, pack: dict) -> dict:
        out = super().__call__(pack)
        out["token_type_ids"] = (out["input_ids"] == self.spec.image_token_id).to(torch.int64)
        return out

    def packed_mask(self, inputs: dict, additive: torch.dtype | None):
        if self.spec.sliding_window is None:
            raise AdapterError("Gemma 3's packed masks need the text model's sliding_window: build the spec with "
                               "ModelSpec.from_folder(MODEL_DIR), or the adapter with HFBatchAdapter.for_model")
        return gemma3_packed_masks(inputs["cu_seq_lens_q"], inputs["token_type_ids"], self.spec.sliding_window,
                                   additive)
