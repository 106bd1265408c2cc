"""The generic family's output adapter: the model gets exactly what its processor returns for a pack's images.

A pack loaded with the `processor` image policy (`decode.tiling.processor`) holds the processor's
outputs for its images as they come out of it for all of them at once: `pixel_values` (already rescaled
and normalised by the image processor, float32) and the other keys as `processor_<key>` (e.g.
`processor_image_sizes`). This adapter hands them to `forward` under the processor's names, with
`input_ids`, `labels`, 1-D `position_ids` restarting per sample, the `cu_seq_lens_*` boundaries and, for
sdpa/eager, the block-diagonal causal mask. Pixels cross the DataLoader as float32 (4x the bytes of the
native families' uint8): one reason the generic family is slower.
"""
from __future__ import annotations

import torch

from vlmdata.decode.tiling.processor import PROCESSOR_PREFIX
from vlmdata.hf.adapter import HFBatchAdapter, _rows

__all__ = ["ProcessorAdapter"]


class ProcessorAdapter(HFBatchAdapter):
    """Any model through its own processor's outputs (see the module docstring)."""

    family = ("generic",)

    def images(self, pack: dict) -> dict:
        if "pixel_values" not in pack:
            return {}
        out = {"pixel_values": pack["pixel_values"]}
        out.update({k[len(PROCESSOR_PREFIX):]: v for k, v in pack.items() if k.startswith(PROCESSOR_PREFIX)})
        return out

    def positions(self, pack: dict, host: dict) -> torch.Tensor:
        return _rows(pack["position_ids"])

    def normalise(self, pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return pixels.to(dtype)
