"""Varlen attention: the reference backend against a dense block-diagonal oracle, and backend choice."""
import pytest
import torch

from vlmdata_pipelines.attention import (
    available_backends,
    dense_masked_attention,
    reference_varlen_attention,
    resolve_backend,
    varlen_attention,
)


def _qkv(total, heads=3, dim=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(total, heads, dim, generator=g, dtype=dtype) for _ in range(3)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lengths", [[5, 12, 1, 13], [7, 7, 7], [30], [4, 0, 9]])
def test_reference_matches_block_diagonal_mask(causal, lengths):
    q, k, v = _qkv(sum(lengths))
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32)
    out = reference_varlen_attention(q, k, v, cu, causal)
    expected = dense_masked_attention(q, k, v, cu, causal)
    assert out.shape == q.shape
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_segments_do_not_see_each_other():
    """Changing one segment's keys/values leaves the other segments' outputs unchanged."""
    q, k, v = _qkv(20)
    cu = torch.tensor([0, 8, 20], dtype=torch.int32)
    base = varlen_attention(q, k, v, cu, 12, causal=True, backend="reference")
    k2, v2 = k.clone(), v.clone()
    k2[8:] += 5.0
    v2[8:] -= 3.0
    changed = varlen_attention(q, k2, v2, cu, 12, causal=True, backend="reference")
    assert torch.equal(base[:8], changed[:8])
    assert not torch.allclose(base[8:], changed[8:])


def test_causal_token_ignores_future():
    q, k, v = _qkv(10)
    cu = torch.tensor([0, 10], dtype=torch.int32)
    base = varlen_attention(q, k, v, cu, 10, causal=True)
    v2 = v.clone()
    v2[6:] = 0
    out = varlen_attention(q, k, v2, cu, 10, causal=True)
    assert torch.equal(base[:6], out[:6])
    assert not torch.allclose(base[6:], out[6:])


def test_backend_resolution_on_cpu():
    q = torch.zeros(4, 2, 8)
    assert resolve_backend("auto", q) == "reference"
    assert available_backends("cpu") == ["reference"]
    with pytest.raises(RuntimeError, match="cannot run on cpu"):
        resolve_backend("torch", q)
    with pytest.raises(ValueError, match="unknown attention backend"):
        resolve_backend("xformers", q)


def test_bad_cu_seqlens_is_a_clear_error():
    q, k, v = _qkv(10)
    with pytest.raises(ValueError, match="cu_seqlens must run from 0 to T=10"):
        reference_varlen_attention(q, k, v, torch.tensor([0, 4, 9], dtype=torch.int32), True)


def test_empty_pack():
    q = torch.zeros(0, 2, 8)
    out = varlen_attention(q, q, q, torch.zeros(1, dtype=torch.int32), 0, causal=True)
    assert out.shape == (0, 2, 8)
