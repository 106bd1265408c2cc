"""build_pack: the whole-pack fast path gives exactly the fields of prepare_sample + collate_pack."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from vlmdata.decode import DynamicPolicy, FixedPolicy
from vlmdata.loading import CollateConfig, collate_pack, pack_build, prepare_sample
from vlmdata.metrics import StatsDelta
from vlmdata.text import ByteTokenizer, encode_conversation

TOK = ByteTokenizer()


@dataclass
class SampleRecord:                       # what build_pack reads of a formats.SampleRecord
    key: str
    tokens: np.ndarray
    images: list
    sizes: list


def cfg(policy, max_tokens=4096, defer=False):
    return CollateConfig(policy=policy, image_token_id=TOK.special.image, pad_token_id=TOK.special.pad,
                         max_tokens=max_tokens, defer_decode=defer)


def records(seed=0, n=6, side=56):
    rng = np.random.default_rng(seed)
    out, images = [], []
    for i in range(n):
        k = int(rng.integers(0, 3))
        text = " ".join(["word"] * int(rng.integers(1, 40)))
        tokens = encode_conversation(TOK, [("user", "<image>" * k + "Q?"), ("assistant", text)], k)
        sizes = [(int(rng.integers(60, 300)), int(rng.integers(60, 300))) for _ in range(k)]
        ims = [np.full((side, side, 3), 10 * i + j, np.uint8) for j in range(k)]
        out.append(SampleRecord(key=f"s{i}", tokens=tokens, images=ims, sizes=sizes))
        images.append(ims)
    return out, images


def slow(recs, images, c):
    prepared = [prepare_sample(r.key, r.tokens, ims, r.sizes, c)[0] for r, ims in zip(recs, images)]
    return collate_pack(prepared, c, StatsDelta())


def same(a, b):
    assert set(a) == set(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]) and a[k].stride() == b[k].stride(), k
        else:
            assert a[k] == b[k], k


def test_fast_path_equals_per_sample_path_fixed(monkeypatch):
    c = cfg(FixedPolicy(56, 14))
    recs, ims = records()
    stats = StatsDelta()
    fast = pack_build.build_pack(recs, ims, c, stats)
    assert pack_build._fast_pack(recs, ims, c, StatsDelta()) is not None       # really the fast path
    same(fast, slow(recs, ims, c))
    assert stats.samples == len(recs) and stats.images == sum(map(len, ims)) and stats.packs == 1
    assert stats.real_tokens == fast["input_ids"].numel() and stats.truncated == 0


def test_fast_path_equals_per_sample_path_dynamic_and_deferred():
    pol = DynamicPolicy(patch=14, merge=2, min_pixels=56 * 56, max_pixels=112 * 112)
    recs, _ = records(seed=1)
    ims = [[np.zeros((*reversed(pol.target_size(w, h)), 3), np.uint8) + 7 for w, h in r.sizes] for r in recs]
    same(pack_build.build_pack(recs, ims, cfg(pol), StatsDelta()), slow(recs, ims, cfg(pol)))
    enc = [[memoryview(b"\xff\xd8" + bytes([j]) * (5 + j)) for j in range(len(r.sizes))] for r in recs]
    a, b = pack_build.build_pack(recs, enc, cfg(FixedPolicy(56, 14), defer=True), StatsDelta()), \
        slow(recs, enc, cfg(FixedPolicy(56, 14), defer=True))
    assert [bytes(x) for x in a.pop("image_bytes")] == [bytes(x) for x in b.pop("image_bytes")]
    same(a, b)


@pytest.mark.parametrize("case", ["truncated", "mismatch", "skipped"])
def test_other_packs_take_the_per_sample_path(case):
    c = cfg(FixedPolicy(56, 14), max_tokens=4096 if case != "truncated" else 60)
    recs, ims = records(seed=2)
    if case == "mismatch":
        victim = next(i for i, x in enumerate(ims) if x)
        ims[victim] = ims[victim][:-1]                     # one image fewer than placeholders: a bad sample
    if case == "skipped":
        ims[0] = None                                      # decode failed: counted by the caller
    stats = StatsDelta()
    got = pack_build.build_pack(recs, ims, c, stats)
    kept = [(r, x) for r, x in zip(recs, ims) if x is not None and (case != "mismatch" or x is not ims[victim])]
    assert got["sample_keys"] == [r.key for r, _ in kept]
    if case == "truncated":
        assert stats.truncated > 0 and int(got["cu_seqlens"].diff().max()) <= 60
    if case == "mismatch":
        assert stats.skipped == {"bad_sample": 1}
