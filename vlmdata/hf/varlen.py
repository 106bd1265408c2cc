"""A packed attention implementation for transformers that needs no flash-attn package: "vlmdata_varlen".

transformers' packed path hands `cu_seq_lens_q/k` and `max_length_q/k` to the
attention function; only the flash-attention implementations read them, so on
a CPU (or a GPU without the flash-attn package) a pack needs the 4-D block
mask, whose cost is T^2 per head and layer however short the samples are.
`register_varlen_attention()` adds an implementation to transformers'
`AttentionInterface` that reads the boundaries instead:

- causal attention (the language model) with `cu_seq_lens_q` on a [1, T]
  pack: attention inside each sample only, so the cost is sum(L_i^2); on CUDA
  in fp16/bf16 with torch's `torch.nn.attention.varlen.varlen_attn`,
  elsewhere one `scaled_dot_product_attention` per sample (the gradient
  flows through a split, so backward is one concatenation);
- anything else (vision towers, padded batches, no boundaries): transformers'
  own sdpa with the mask it was given (padding only: the implementation
  registers flash-attention's mask function, which makes no T x T mask).

Use it as `attn_implementation="vlmdata_varlen"` after registering (`vlmdata.hf.load_model`
registers it and picks it where flash-attention 2 is not available).
"""
from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

__all__ = ["VARLEN_ATTENTION", "register_varlen_attention", "varlen_attention_forward"]

VARLEN_ATTENTION = "vlmdata_varlen"
_HALF = (torch.float16, torch.bfloat16)


def register_varlen_attention() -> str:
    """Register "vlmdata_varlen" with transformers (idempotent); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
    AttentionMaskInterface.register(VARLEN_ATTENTION, flash_attention_mask)
    return VARLEN_ATTENTION


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return x
    b, h, n, d = x.shape
    return x[:, :, None].expand(b, h, groups, n, d).reshape(b, h * groups, n, d)


def _padding_mask(mask: torch.Tensor, q_len: int, device: torch.device) -> torch.Tensor:
    """A 2-D padding mask [B, K] -> 4-D causal & padding bool mask [B, 1, Q, K] (every row keeps one key)."""
    keys = mask.to(device=device, dtype=torch.bool)
    k_len = keys.shape[-1]
    causal = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)
    full = causal[None, None] & keys[:, None, None, :]
    empty = ~full.any(dim=-1, keepdim=True)                  # rows of padding with nothing to attend to
    return full | (empty & torch.eye(q_len, k_len, dtype=torch.bool, device=device)[None, None])


def varlen_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                             scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers attention function: q [B, H, Q, D], k/v [B, Hkv, K, D] -> ([B, Q, H, D], None)."""
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    cu = kwargs.get("cu_seq_lens_q")
    packed = (cu is not None and causal and query.shape[0] == 1 and query.shape[2] == key.shape[2]
              and attention_mask is None and int(cu[-1]) == query.shape[2])
    if not packed:
        mask = attention_mask
        if mask is not None and mask.dim() == 2:
            mask = _padding_mask(mask, query.shape[2], query.device)
        use_causal = bool(causal) and mask is None and query.shape[2] > 1
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling,
                                             is_causal=use_causal)
        return out.transpose(1, 2).contiguous(), None
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))          # [T, H, D]
    if query.is_cuda and query.dtype in _HALF and importlib.util.find_spec("torch.nn.attention.varlen"):
        from torch.nn.attention.varlen import varlen_attn

        cu32 = cu.to(device=query.device, dtype=torch.int32)
        longest = int(kwargs.get("max_length_q") or int((cu32[1:] - cu32[:-1]).max()))
        out = varlen_attn(q, k, v, cu32, cu32, longest, longest, scale=scaling, window_size=(-1, 0))
    else:
        lengths = (cu[1:] - cu[:-1]).tolist()
        parts = []
        for qs, ks, vs in zip(*(t.split(lengths) for t in (q, k, v))):
            if qs.shape[0]:
                qs, ks, vs = (x.transpose(0, 1).unsqueeze(0) for x in (qs, ks, vs))    # [1, H, L, D]
                o = F.scaled_dot_product_attention(qs, ks, vs, dropout_p=dropout, scale=scaling, is_causal=True)
                parts.append(o[0].transpose(0, 1))
        out = torch.cat(parts, dim=0)
    return out.unsqueeze(0), None                                          # [1, T, H, D]
