"""DaliCpuDecoder: shapes, chunking, corrupt images costing exactly themselves, fork safety.

(The pipeline runner it is built on: tests/decode/dali/test_pipeline.py.)"""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from tests.helpers.decode import NOT_AN_IMAGE, corpus_images, truncated
from vlmdata.decode import DynamicPolicy, FixedPolicy
from vlmdata.decode.dali import DaliCpuDecoder


@pytest.fixture(scope="module")
def images(small_llava_corpus):
    return corpus_images(small_llava_corpus, limit=24)


def test_fixed_and_dynamic_shapes(images):
    data, sizes = images
    dec = DaliCpuDecoder(max_batch=8)
    for policy in (FixedPolicy(336), DynamicPolicy()):
        out = dec.decode(data, sizes, policy)
        assert len(out) == len(data)
        for arr, (w, h) in zip(out, sizes):
            tw, th = policy.target_size(w, h)
            assert arr.shape == (th, tw, 3) and arr.dtype == np.uint8
            assert arr.std() > 1.0  # real picture content, not a blank buffer
    # 24 images in chunks of 8: three runs per policy, no failures
    assert dec.runner.runs == 6 and not dec.errors


def test_partial_batches_match_full_batches(images):
    data, sizes = images
    full = DaliCpuDecoder(max_batch=16).decode(data[:16], sizes[:16], FixedPolicy(224))
    small = DaliCpuDecoder(max_batch=16)
    parts = small.decode(data[:5], sizes[:5], FixedPolicy(224)) + small.decode(data[5:16], sizes[5:16], FixedPolicy(224))
    for a, b in zip(full, parts):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad_kind", ["truncated", "not_an_image", "empty", "two_truncated"])
def test_corrupt_image_costs_exactly_itself(images, bad_kind):
    data, sizes = images
    data, sizes = data[:10], sizes[:10]
    policy = FixedPolicy(112)
    clean = DaliCpuDecoder(max_batch=16).decode(data, sizes, policy)
    bad = list(data)
    bad_at = {3}
    if bad_kind == "truncated":
        bad[3] = truncated(data[3])
    elif bad_kind == "not_an_image":
        bad[3] = NOT_AN_IMAGE
    elif bad_kind == "empty":
        bad[3] = b""
    else:
        bad[3], bad[8] = truncated(data[3]), truncated(data[8])
        bad_at = {3, 8}
    dec = DaliCpuDecoder(max_batch=16)
    out = dec.decode(bad, sizes, policy)
    assert {i for i, o in enumerate(out) if o is None} == bad_at
    for i, (a, b) in enumerate(zip(clean, out)):
        if i not in bad_at:
            np.testing.assert_array_equal(a, b)
    assert sum(dec.pop_errors().values()) == len(bad_at)   # rejected by DALI and by the CPU fallback
    # the decoder keeps working after a failed batch
    again = dec.decode(data[:4], sizes[:4], policy)
    assert all(o is not None for o in again)


def test_lazy_and_picklable(images):
    data, sizes = images
    dec = DaliCpuDecoder()
    assert not dec.runner.built
    dec.decode(data[:2], sizes[:2], FixedPolicy(56))
    assert dec.runner.built
    clone = pickle.loads(pickle.dumps(dec))
    assert not clone.runner.built  # the pipeline never travels
    assert clone.decode(data[:1], sizes[:1], FixedPolicy(56))[0].shape == (56, 56, 3)


class _DecodeDataset(torch.utils.data.IterableDataset):
    def __init__(self, dec, data, sizes):
        self.dec, self.data, self.sizes = dec, data, sizes

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for i in range(info.id, len(self.data), info.num_workers):
            (arr,) = self.dec.decode([self.data[i]], [self.sizes[i]], FixedPolicy(56))
            yield i, int(arr.astype(np.int64).sum()), self.dec.runner.built


def test_dataloader_workers_build_their_own_pipeline(images):
    data, sizes = images
    data, sizes = data[:6], sizes[:6]
    dec = DaliCpuDecoder()
    expected = {i: int(a.astype(np.int64).sum()) for i, a in enumerate(dec.decode(data, sizes, FixedPolicy(56)))}
    assert dec.runner.built  # built in the parent before the fork: children must rebuild, not reuse
    loader = torch.utils.data.DataLoader(_DecodeDataset(dec, data, sizes), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    rows = list(loader)
    assert {int(i): s for i, s, _ in rows} == expected
    assert all(built for _, _, built in rows)


def test_systemic_dali_failure_is_loud_and_costs_no_image(images, caplog, monkeypatch):
    """Bad data is skipped and counted; a DALI that decodes nothing is reported, and the CPU decodes instead."""
    data, sizes = images
    junk = [truncated(d)[:200] for d in data[:5]]   # JPEG headers, no scan data at all
    dec = DaliCpuDecoder()
    with pytest.raises(RuntimeError, match="decoded none of 5 images"):   # the runner alone stays strict
        dec.runner.run(junk, [(56, 56)] * 5, np.array)
    out = dec.decode(junk[:3] + data[:1], sizes[:4], FixedPolicy(56))   # a few bad among good: skipped
    assert [o is None for o in out] == [True, True, True, False]
    assert dec.pop_errors() == {"corrupt_image": 3} and dec.fallbacks["dali_failed"] == 3

    def broken(*args, **kwargs):
        raise RuntimeError("simulated pipeline failure")

    monkeypatch.setattr(dec.runner, "_run_once", broken)
    out = dec.decode(data[:5], sizes[:5], FixedPolicy(56))
    assert all(o is not None and o.shape == (56, 56, 3) for o in out)
    assert dec.fallbacks["dali_failed"] == 3 + 5 and dec.pop_errors() == {}
    assert "DALI failed on all 5 images" in caplog.text
