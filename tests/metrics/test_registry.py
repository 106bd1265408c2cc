"""MetricSet, the Prometheus registry: exact absorption of StatsDelta (objects and dicts), with and without rank
labels, the exported series."""
from __future__ import annotations

from collections import Counter

import pytest

from tests.helpers.metrics import registry_value as value
from vlmdata.metrics import MetricSet, StatsDelta, exported_series


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


def test_exported_series_names_and_labels():
    names = exported_series(MetricSet())
    assert names["vlmdata_samples_total"] == ("rank",)
    assert names["vlmdata_skipped_samples_total"] == ("rank", "reason")
    assert names["vlmdata_cache_hits_total"] == ("tier",)
    assert names["vlmdata_step_duration_seconds_bucket"] == ("rank", "le")
    assert names["vlmdata_prefetch_lead_items"] == ()
    assert all(n.startswith("vlmdata_") for n in names)


def test_training_toolbox_metrics():
    """Profiled phase seconds add up; optimizer and GPU gauges hold the last reading; None readings are skipped."""
    ms = MetricSet()
    ms.observe_phases({"backward": 0.5, "lm_forward": 0.25, "communication": 0.0}, rank=1)
    ms.observe_phases({"backward": 0.5}, rank=1)
    assert value(ms, "vlmdata_train_phase_seconds_total", rank="1", phase="backward") == pytest.approx(1.0)
    assert value(ms, "vlmdata_train_phase_seconds_total", rank="1", phase="lm_forward") == pytest.approx(0.25)
    assert value(ms, "vlmdata_train_phase_seconds_total", rank="1", phase="communication") is None
    ms.observe_optimizer(2.5, 1e-3, rank=1)
    ms.observe_optimizer(1.5, 5e-4, rank=1)
    assert value(ms, "vlmdata_train_grad_norm", rank="1") == 1.5
    assert value(ms, "vlmdata_train_learning_rate", rank="1") == 5e-4
    ms.observe_allreduce(1000, rank=1)
    ms.observe_allreduce(24, rank=1)
    assert value(ms, "vlmdata_train_allreduce_bytes_total", rank="1") == 1024
    ms.observe_gpu({"gpu": 3, "utilization": 0.75, "memory_used": 10, "memory_peak": 12, "memory_total": 80,
                    "max_allocated": 9}, rank=1)
    ms.observe_gpu({"gpu": 3, "utilization": None, "memory_used": None, "memory_peak": None, "memory_total": None,
                    "max_allocated": 11}, rank=1)  # no NVML: only the allocator peak moves
    assert value(ms, "vlmdata_gpu_utilization_ratio", rank="1", gpu="3") == 0.75
    assert value(ms, "vlmdata_gpu_memory_used_bytes", rank="1", gpu="3") == 10
    assert value(ms, "vlmdata_gpu_memory_peak_bytes", rank="1", gpu="3") == 12
    assert value(ms, "vlmdata_gpu_memory_total_bytes", rank="1", gpu="3") == 80
    assert value(ms, "vlmdata_gpu_max_memory_allocated_bytes", rank="1") == 11
    plain = MetricSet(rank_labels=False)
    plain.observe_gpu({"gpu": 0, "utilization": 0.5, "max_allocated": 1})
    assert value(plain, "vlmdata_gpu_utilization_ratio", gpu="0") == 0.5
