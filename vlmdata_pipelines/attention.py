"""Variable-length attention over packed sequences, described by `cu_seqlens`.

Tensors are laid out as Flash-Attention's varlen kernels want them:
q, k, v of shape [T, H, D], where T is the total number of tokens of all
sequences, and `cu_seqlens` (int32, [n+1]) the sequence boundaries. A token
attends only to tokens of its own sequence (causally or not), which is what
keeps packed samples from contaminating each other.

Backends, chosen by name or with "auto":
- "flash": `flash_attn.flash_attn_varlen_func` (CUDA, fp16/bf16), when importable;
- "torch": `torch.nn.attention.varlen.varlen_attn` (CUDA, fp16/bf16; causal is
  expressed as window_size=(-1, 0) in torch 2.13);
- "reference": plain PyTorch on any device and dtype: one
  `scaled_dot_product_attention` call per sequence (a single batched call when
  all sequences have the same length, e.g. fixed-size images or padded rows).
  Its cost is sum(L_i^2), not T^2 as a block-diagonal mask would be.
"""
from __future__ import annotations

import importlib.util
from functools import cache

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "flash", "torch", "reference")
_HALF = (torch.float16, torch.bfloat16)


@cache
def flash_attn_importable() -> bool:
    """True when the flash-attn package can be imported (checked once)."""
    if importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401
    except ImportError:
        return False
    return True


@cache
def torch_varlen_importable() -> bool:
    """True when this torch build ships torch.nn.attention.varlen."""
    return importlib.util.find_spec("torch.nn.attention.varlen") is not None


def available_backends(device: torch.device | str, dtype: torch.dtype = torch.float32) -> list[str]:
    """Backends that can run on `device` with `dtype` in this environment."""
    device = torch.device(device)
    names = ["reference"]
    if device.type == "cuda" and dtype in _HALF:
        if torch_varlen_importable():
            names.append("torch")
        if flash_attn_importable():
            names.append("flash")
    return names


def resolve_backend(name: str, q: torch.Tensor) -> str:
    """The concrete backend for `name` given the query tensor's device and dtype."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}: choose one of {BACKENDS}")
    usable = available_backends(q.device, q.dtype)
    if name == "auto":
        for candidate in ("flash", "torch", "reference"):
            if candidate in usable:
                return candidate
    if name not in usable:
        raise RuntimeError(f"attention backend {name!r} cannot run on {q.device} with {q.dtype}; "
                           f"available here: {usable}")
    return name


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     max_seqlen: int, causal: bool, backend: str = "auto") -> torch.Tensor:
    """Attention within each sequence of a pack; q, k, v: [T, H, D] -> [T, H, D]."""
    if q.shape[0] == 0:
        return q.clone()
    name = resolve_backend(backend, q)
    if name == "flash":
        from flash_attn import flash_attn_varlen_func

        cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
        return flash_attn_varlen_func(q, k, v, cu, cu, int(max_seqlen), int(max_seqlen), causal=causal)
    if name == "torch":
        from torch.nn.attention.varlen import varlen_attn

        cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
        window = (-1, 0) if causal else (-1, -1)
        return varlen_attn(q, k, v, cu, cu, int(max_seqlen), int(max_seqlen), window_size=window)
    return reference_varlen_attention(q, k, v, cu_seqlens, causal)


def reference_varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               cu_seqlens: torch.Tensor, causal: bool) -> torch.Tensor:
    """Pure PyTorch varlen attention: SDPA per sequence (batched when lengths are equal)."""
    bounds = [int(b) for b in cu_seqlens.tolist()]
    if bounds[0] != 0 or bounds[-1] != q.shape[0]:
        raise ValueError(f"cu_seqlens must run from 0 to T={q.shape[0]}, got {bounds[0]}..{bounds[-1]}")
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    if any(n < 0 for n in lengths):
        raise ValueError("cu_seqlens must be non-decreasing")
    # SDPA gets 4-D [batch, H, L, D] inputs: on CPU, 3-D inputs miss the fused (flash) kernel and
    # fall back to the math path, several times slower.
    nonzero = [n for n in lengths if n]
    if nonzero and len(nonzero) == len(lengths) and min(lengths) == max(lengths):
        n, size = len(lengths), lengths[0]
        qb, kb, vb = (t.reshape(n, size, *t.shape[1:]).transpose(1, 2) for t in (q, k, v))  # [n, H, L, D]
        out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal)
        return out.transpose(1, 2).reshape(q.shape[0], *out.shape[1:2], out.shape[-1])
    # split (not slicing): its backward is one concatenation, where per-segment slices would each
    # scatter their gradient into a zero tensor of the whole pack.
    parts = []
    for qs, ks, vs in zip(*(t.split(lengths) for t in (q, k, v))):
        if qs.shape[0]:
            qs, ks, vs = (x.transpose(0, 1).unsqueeze(0) for x in (qs, ks, vs))  # [1, H, L, D]
            parts.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)[0].transpose(0, 1))
    return torch.cat(parts, dim=0)


def dense_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cu_seqlens: torch.Tensor, causal: bool) -> torch.Tensor:
    """Block-diagonal masked attention over the whole pack (O(T^2)); a test oracle only."""
    total = q.shape[0]
    seg = torch.bucketize(torch.arange(total, device=q.device), cu_seqlens[1:].to(q.device), right=True)
    mask = seg[:, None] == seg[None, :]
    if causal:
        mask &= torch.ones(total, total, dtype=torch.bool, device=q.device).tril()
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask)
    return out.transpose(0, 1)
