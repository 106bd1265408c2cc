"""MetricSet / StatsDelta: exact absorption, plain-data round trips, LoaderMetrics timing."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from vlmdata.metrics import (
    LoaderMetrics,
    MetricSet,
    StatsDelta,
    exported_series,
    instrument,
    take_fetch_stats,
)


def value(ms: MetricSet, name: str, **labels) -> float | None:
    return ms.registry.get_sample_value(name, labels)


def test_absorb_adds_every_field_exactly():
    ms = MetricSet()
    d = StatsDelta(samples=3, images=5, real_tokens=700, padded_tokens=12, packs=1, truncated=1,
                   decode_seconds=0.25, skipped=Counter({"bad_image": 2}))
    d.record_fetch("memory", hit=True, nbytes=10)
    d.record_fetch("remote", hit=False, nbytes=4096)
    d.evictions["disk"] += 2
    d.prefetch_lead = 7
    ms.absorb(d, rank=1)
    ms.absorb(d.to_dict(), rank=1)  # the dict form, as it comes out of a DataLoader
    assert value(ms, "vlmdata_samples_total", rank="1") == 6
    assert value(ms, "vlmdata_images_total", rank="1") == 10
    assert value(ms, "vlmdata_real_tokens_total", rank="1") == 1400
    assert value(ms, "vlmdata_padding_tokens_total", rank="1") == 24
    assert value(ms, "vlmdata_packs_total", rank="1") == 2
    assert value(ms, "vlmdata_truncated_samples_total", rank="1") == 2
    assert value(ms, "vlmdata_decode_seconds_total", rank="1") == pytest.approx(0.5)
    assert value(ms, "vlmdata_skipped_samples_total", rank="1", reason="bad_image") == 4
    assert value(ms, "vlmdata_cache_hits_total", tier="memory") == 2
    assert value(ms, "vlmdata_cache_misses_total", tier="remote") == 2
    assert value(ms, "vlmdata_fetch_bytes_total", tier="remote") == 8192
    assert value(ms, "vlmdata_fetch_bytes_total", tier="memory") == 20
    assert value(ms, "vlmdata_cache_evictions_total", tier="disk") == 4
    assert value(ms, "vlmdata_prefetch_lead_items") == 7
    assert value(ms, "vlmdata_samples_total", rank="0") is None  # other ranks untouched


def test_absorb_without_rank_labels():
    ms = MetricSet(rank_labels=False)
    ms.absorb(StatsDelta(samples=2, skipped=Counter({"too_long": 1})), rank=3)
    ms.observe_step(0.5)
    assert value(ms, "vlmdata_samples_total") == 2
    assert value(ms, "vlmdata_skipped_samples_total", reason="too_long") == 1
    assert value(ms, "vlmdata_steps_total") == 1


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


def test_exported_series_names_and_labels():
    names = exported_series(MetricSet())
    assert names["vlmdata_samples_total"] == ("rank",)
    assert names["vlmdata_skipped_samples_total"] == ("rank", "reason")
    assert names["vlmdata_cache_hits_total"] == ("tier",)
    assert names["vlmdata_step_duration_seconds_bucket"] == ("rank", "le")
    assert names["vlmdata_prefetch_lead_items"] == ()
    assert all(n.startswith("vlmdata_") for n in names)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_loader_metrics_measures_wait_and_steps_exactly():
    clock = FakeClock()

    def batches():  # each batch takes 2 s to produce; stats ride along
        for i in range(3):
            clock.now += 2.0
            yield {"stats": StatsDelta(samples=i + 1, packs=1).to_dict()}

    ms = MetricSet()
    for _ in LoaderMetrics(batches(), ms, rank=0, clock=clock):
        clock.now += 1.0  # the training step's own work
    assert value(ms, "vlmdata_data_wait_seconds_total", rank="0") == pytest.approx(6.0)
    assert value(ms, "vlmdata_step_seconds_total", rank="0") == pytest.approx(9.0)
    assert value(ms, "vlmdata_steps_total", rank="0") == 3
    assert value(ms, "vlmdata_step_duration_seconds_count", rank="0") == 3
    assert value(ms, "vlmdata_samples_total", rank="0") == 6
    assert value(ms, "vlmdata_packs_total", rank="0") == 3


def test_loader_metrics_early_break_closes_last_step():
    clock = FakeClock()

    def batches():
        while True:
            clock.now += 0.5
            yield {"x": 1}  # no stats: nothing absorbed, timing still measured

    ms = MetricSet()
    it = LoaderMetrics(batches(), ms, rank="2", clock=clock)
    for n, _ in enumerate(it, 1):
        clock.now += 1.5
        if n == 4:
            break
    assert value(ms, "vlmdata_steps_total", rank="2") == 4
    assert value(ms, "vlmdata_step_seconds_total", rank="2") == pytest.approx(8.0)
    assert value(ms, "vlmdata_data_wait_seconds_total", rank="2") == pytest.approx(2.0)
    assert value(ms, "vlmdata_samples_total", rank="2") is None


def test_instrument_wraps_with_real_clock():
    ms = MetricSet()
    got = list(instrument([{"stats": StatsDelta(images=2).to_dict()}, {"stats": StatsDelta(images=3)}], ms, 0))
    assert len(got) == 2
    assert value(ms, "vlmdata_images_total", rank="0") == 5
    assert value(ms, "vlmdata_steps_total", rank="0") == 2
    wait = value(ms, "vlmdata_data_wait_seconds_total", rank="0")
    assert 0 <= wait <= value(ms, "vlmdata_step_seconds_total", rank="0")
