"""Sample boundaries: the flash-attention keyword arguments and the 4-D block-diagonal causal mask."""
from __future__ import annotations

import pytest
import torch

from vlmdata.errors import ConfigError
from vlmdata.hf import attention_kind, block_causal_mask, flash_kwargs


def test_flash_kwargs():
    cu = torch.tensor([0, 3, 7], dtype=torch.int64)
    kw = flash_kwargs(cu, 4)
    assert kw["cu_seq_lens_q"].dtype == torch.int32 and kw["cu_seq_lens_q"].tolist() == [0, 3, 7]
    assert kw["cu_seq_lens_k"] is kw["cu_seq_lens_q"]
    assert (kw["max_length_q"], kw["max_length_k"]) == (4, 4)


def test_block_mask_by_brute_force():
    cu = torch.tensor([0, 2, 2, 5, 6])
    mask = block_causal_mask(cu, 6)
    assert mask.shape == (1, 1, 6, 6) and mask.dtype == torch.bool
    sample = [0, 0, 2, 2, 2, 3]
    for i in range(6):
        for j in range(6):
            assert bool(mask[0, 0, i, j]) == (j <= i and sample[i] == sample[j]), (i, j)
    additive = block_causal_mask(cu, 6, additive_dtype=torch.float32)
    assert additive.dtype == torch.float32
    assert torch.equal(additive == 0, mask)
    assert float(additive.min()) == torch.finfo(torch.float32).min


def test_attention_kinds():
    assert attention_kind("flash_attention_2") == attention_kind("kernels-community/flash-attn") == "varlen"
    assert attention_kind("vlmdata_varlen") == "varlen"
    assert attention_kind("sdpa") == attention_kind("eager") == attention_kind(None) == "masked"
    with pytest.raises(ConfigError, match="flex_attention.*not supported"):
        attention_kind("flex_attention")
