"""Sample boundaries of a pack in the two forms Hugging Face models read.

- `flash_kwargs(cu_seqlens, max_seqlen)`: `cu_seq_lens_q`, `cu_seq_lens_k`
  (int32 [n + 1]) and `max_length_q`, `max_length_k` (int), the keyword
  arguments transformers' packed-sequence path hands to flash-attention's
  varlen kernel (the names `DataCollatorWithFlattening` produces). The
  flash-attention implementations and vlmdata's "vlmdata_varlen"
  (`vlmdata.hf.varlen`) read them; sdpa and eager ignore them.
- `block_causal_mask(cu_seqlens, ...)`: a 4-D [1, 1, T, T] mask, causal inside
  each sample and closed across samples, for the implementations that ignore
  the flash arguments. transformers uses a 4-D `attention_mask` as given. sdpa
  takes a boolean mask (True = attend); eager adds the mask to the scores, so it
  gets an additive float mask (0 or the dtype's minimum).

`attention_kind(name)` says which form an attention implementation needs.
"""
from __future__ import annotations

import torch

from vlmdata.errors import ConfigError

__all__ = ["MASKED", "VARLEN", "attention_kind", "block_causal_mask", "flash_kwargs"]

VARLEN = "varlen"     # reads cu_seq_lens_q/k (flash-attention 2/3, hub flash kernels, vlmdata_varlen)
MASKED = "masked"     # needs the 4-D block mask (sdpa, eager)

_MASKED = ("sdpa", "eager")


def attention_kind(attn_implementation: str | None) -> str:
    """VARLEN for flash-attention implementations, MASKED for sdpa/eager; anything else is a ConfigError."""
    name = attn_implementation or "eager"
    if "flash" in name or name == "vlmdata_varlen":
        return VARLEN
    if name in _MASKED:
        return MASKED
    raise ConfigError(f"attention implementation {name!r} is not supported on packed batches: use "
                      "flash_attention_2 (GPU), vlmdata_varlen, sdpa or eager")


def flash_kwargs(cu_seqlens: torch.Tensor, max_seqlen: int) -> dict:
    """The varlen keyword arguments for a pack with these boundaries."""
    cu = cu_seqlens.to(torch.int32)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": int(max_seqlen), "max_length_k": int(max_seqlen)}


def block_causal_mask(cu_seqlens: torch.Tensor, total: int, additive_dtype: torch.dtype | None = None,
                      device: torch.device | str | None = None) -> torch.Tensor:
    """[1, 1, T, T] mask: token i attends to j iff j <= i and both are in the same sample.

    Boolean (True = attend) by default; with `additive_dtype`, 0 where attended and the dtype's
    minimum elsewhere (what eager attention adds to the scores).
    """
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    lengths = cu[1:] - cu[:-1]
    seg = torch.repeat_interleave(torch.arange(len(lengths), device=cu.device), lengths, output_size=total)
    pos = torch.arange(total, device=cu.device)
    allowed = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])
    allowed = allowed[None, None]
    if additive_dtype is None:
        return allowed
    zero = torch.zeros((), dtype=additive_dtype, device=cu.device)
    return torch.where(allowed, zero, torch.finfo(additive_dtype).min)
