"""StatsDelta, the counts that travel with packs: plain-data round trips, merging, the fetchers' protocol."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from vlmdata.metrics import StatsDelta, take_fetch_stats


def test_stats_delta_round_trip_and_merge():
    a = StatsDelta(samples=1, images=2, real_tokens=3, skipped=Counter({"x": 1}))
    a.record_fetch("disk", hit=True, nbytes=5)
    assert StatsDelta.from_dict(a.to_dict()) == a
    b = StatsDelta(samples=4, skipped=Counter({"x": 2, "y": 1}), prefetch_lead=3.0)
    a.merge(b).merge(None)
    assert (a.samples, a.images, a.skipped, a.prefetch_lead) == (5, 2, Counter({"x": 3, "y": 1}), 3.0)
    assert not a.is_empty() and StatsDelta().is_empty()
    # old-style dicts (no cache fields) still load; tensors/numpy scalars (DataLoader conversion) too
    old = StatsDelta.from_dict({"samples": torch.tensor(2), "images": np.int64(3), "real_tokens": 4,
                                "padded_tokens": 0, "packs": 1, "truncated": 0, "decode_seconds": 0.1,
                                "skipped": {"bad": torch.tensor(1)}})
    assert (old.samples, old.images, old.skipped["bad"], old.cache_hits) == (2, 3, 1, Counter())
    assert isinstance(old.samples, int)


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown StatsDelta fields"):
        StatsDelta.from_dict({"samples": 1, "smaples": 2})


def test_take_fetch_stats_protocol():
    class Reporting:
        def __init__(self):
            self.pending = StatsDelta()

        def take_stats(self):
            out, self.pending = self.pending, StatsDelta()
            return out.to_dict()

    f = Reporting()
    f.pending.record_fetch("remote", hit=False, nbytes=100)
    got = take_fetch_stats(f)
    assert got.fetch_bytes == Counter({"remote": 100}) and got.cache_misses == Counter({"remote": 1})
    assert take_fetch_stats(f).is_empty()
    assert take_fetch_stats(object()) is None
