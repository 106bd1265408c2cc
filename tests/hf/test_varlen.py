"""The "vlmdata_varlen" attention: per-sample attention from cu_seq_lens, sdpa for everything else."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vlmdata.hf import (
    VARLEN_ATTENTION,
    block_causal_mask,
    flash_kwargs,
    register_varlen_attention,
    varlen_attention_forward,
)


class _Causal(torch.nn.Module):
    is_causal = True


class _Bidirectional(torch.nn.Module):
    is_causal = False


def _qkv(total, heads=4, kv_heads=2, dim=8, batch=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, total, dim, generator=g, requires_grad=True)
    k = torch.randn(batch, kv_heads, total, dim, generator=g, requires_grad=True)
    v = torch.randn(batch, kv_heads, total, dim, generator=g, requires_grad=True)
    return q, k, v


def _dense(q, k, v, mask):
    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)


def test_packed_equals_block_masked_attention_with_gqa():
    cu = torch.tensor([0, 5, 6, 13, 20], dtype=torch.int32)
    q, k, v = _qkv(20)
    out, weights = varlen_attention_forward(_Causal(), q, k, v, None, **flash_kwargs(cu, 7))
    want = _dense(q, k, v, block_causal_mask(cu, 20))
    assert weights is None and out.shape == (1, 20, 4, 8)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    want_grads = torch.autograd.grad(want.sum(), (q, k, v))
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_without_boundaries_it_is_sdpa():
    q, k, v = _qkv(6, batch=2)
    causal, _ = varlen_attention_forward(_Causal(), q, k, v, None)
    torch.testing.assert_close(causal, _dense(q, k, v, torch.ones(6, 6, dtype=torch.bool).tril()))
    full, _ = varlen_attention_forward(_Bidirectional(), q, k, v, None, **flash_kwargs(torch.tensor([0, 3, 6]), 3))
    torch.testing.assert_close(full, _dense(q, k, v, None))              # a vision tower ignores text boundaries
    padding = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    padded, _ = varlen_attention_forward(_Causal(), q, k, v, padding)
    keep = torch.ones(6, 6, dtype=torch.bool).tril()[None, None] & padding.bool()[:, None, None, :]
    torch.testing.assert_close(padded[:, :4], _dense(q, k, v, keep)[:, :4])   # real tokens: causal and unpadded
    assert bool(torch.isfinite(padded).all())


def test_registered_with_transformers():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    assert register_varlen_attention() == VARLEN_ATTENTION
    assert AttentionInterface._global_mapping[VARLEN_ATTENTION] is varlen_attention_forward
    assert VARLEN_ATTENTION in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
