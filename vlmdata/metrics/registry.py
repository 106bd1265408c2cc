"""Every Prometheus metric of vlmdata, defined once.

Names follow Prometheus conventions (base units, `_seconds`, `_bytes`,
`_total`). Metrics live in a `MetricSet` bound to one registry, so tests and
several pipelines in one process never collide and there is no global state
beyond prometheus_client's optional default registry.

DataLoader workers do not touch the registry (nor import prometheus_client):
they attach their counts to each pack (`PackedBatch["stats"]`, a
`vlmdata.metrics.counts.StatsDelta`) and the consuming process adds them
with `MetricSet.absorb`. Counts therefore survive worker
exit and there are no per-process files to grow (prometheus_client's
multiprocess mode is never needed).

A cache used inside a DataLoader worker reports the same way: the dataset
calls `take_fetch_stats(fetcher)` when it finishes a pack and merges the
result into the pack's delta (`StatsDelta.merge`).

What is exported (the `rank` label is absent when `rank_labels=False`):

| metric | type | labels |
|---|---|---|
| vlmdata_samples_total, _images_total, _real_tokens_total, _padding_tokens_total, _packs_total | counter | rank |
| vlmdata_truncated_samples_total, vlmdata_decode_seconds_total | counter | rank |
| vlmdata_compute_flops_total | counter | rank |
| vlmdata_step_imbalance_ratio | histogram | rank |
| vlmdata_skipped_samples_total | counter | rank, reason |
| vlmdata_data_wait_seconds_total, _step_seconds_total, _steps_total | counter | rank |
| vlmdata_step_duration_seconds | histogram | rank |
| vlmdata_train_phase_seconds_total | counter | rank, phase |
| vlmdata_train_grad_norm, vlmdata_train_learning_rate | gauge | rank |
| vlmdata_train_allreduce_bytes_total | counter | rank |
| vlmdata_gpu_utilization_ratio, vlmdata_gpu_memory_used_bytes, _memory_peak_bytes, _memory_total_bytes | gauge | rank, gpu |
| vlmdata_gpu_max_memory_allocated_bytes | gauge | rank |
| vlmdata_cache_hits_total, _cache_misses_total, _fetch_bytes_total, _cache_evictions_total | counter | tier |
| vlmdata_cache_bytes | gauge | tier |
| vlmdata_cache_budget_bytes | gauge | tier |
| vlmdata_cache_budget_needed_bytes | gauge | |
| vlmdata_cache_read_through_total | counter | |
| vlmdata_prefetch_lead_items, vlmdata_inflight_fetches | gauge | |
"""
from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PCounter
from prometheus_client.metrics import MetricWrapperBase

from vlmdata.metrics.counts import StatsDelta

__all__ = ["IMBALANCE_BUCKETS", "STEP_BUCKETS", "MetricSet", "exported_series"]

STEP_BUCKETS = (0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30)
IMBALANCE_BUCKETS = (1.0, 1.01, 1.02, 1.03, 1.05, 1.1, 1.2, 1.5, 2.0)


class MetricSet:
    """All vlmdata metrics registered on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None, rank_labels: bool = True):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.rank_labels = rank_labels
        r = self.registry
        rank = ["rank"] if rank_labels else []
        # loader output
        self.samples = PCounter("vlmdata_samples_total", "Samples delivered to the consumer", rank, registry=r)
        self.images = PCounter("vlmdata_images_total", "Images delivered to the consumer", rank, registry=r)
        self.real_tokens = PCounter("vlmdata_real_tokens_total", "Non-padding tokens delivered", rank, registry=r)
        self.padded_tokens = PCounter("vlmdata_padding_tokens_total", "Padding tokens delivered", rank, registry=r)
        self.packs = PCounter("vlmdata_packs_total", "Packs (batches) delivered", rank, registry=r)
        self.skipped = PCounter("vlmdata_skipped_samples_total", "Samples skipped, by reason", rank + ["reason"], registry=r)
        self.truncated = PCounter("vlmdata_truncated_samples_total", "Samples truncated to max_tokens", rank, registry=r)
        self.decode_seconds = PCounter("vlmdata_decode_seconds_total", "Seconds spent decoding images", rank, registry=r)
        self.compute_flops = PCounter("vlmdata_compute_flops_total",
                                      "Training FLOPs of the packs delivered (the balance's cost model)", rank, registry=r)
        self.step_imbalance = Histogram("vlmdata_step_imbalance_ratio",
                                        "Slowest / mean rank cost of each step (balanced plans)", rank, registry=r,
                                        buckets=IMBALANCE_BUCKETS)
        # training loop
        self.data_wait_seconds = PCounter("vlmdata_data_wait_seconds_total", "Seconds the consumer waited for data", rank, registry=r)
        self.step_seconds = PCounter("vlmdata_step_seconds_total", "Seconds in training steps, data wait included", rank, registry=r)
        self.steps = PCounter("vlmdata_steps_total", "Training steps completed", rank, registry=r)
        self.step_time = Histogram("vlmdata_step_duration_seconds", "Duration of one training step", rank, registry=r,
                                   buckets=STEP_BUCKETS)
        # training toolbox (vlmdata_pipelines/: profiler breakdown, optimizer health, DDP hook, GPU telemetry)
        self.phase_seconds = PCounter("vlmdata_train_phase_seconds_total",
                                      "Seconds of profiled training steps, by phase (they add up to the step time)",
                                      rank + ["phase"], registry=r)
        self.grad_norm = Gauge("vlmdata_train_grad_norm", "Global gradient norm of the last step, before clipping",
                               rank, registry=r)
        self.learning_rate = Gauge("vlmdata_train_learning_rate", "Learning rate of the last step", rank, registry=r)
        self.allreduce_bytes = PCounter("vlmdata_train_allreduce_bytes_total",
                                        "Gradient bytes handed to all-reduce by the DDP communication hook",
                                        rank, registry=r)
        gpu = rank + ["gpu"]
        self.gpu_utilization = Gauge("vlmdata_gpu_utilization_ratio",
                                     "Fraction of NVML's last sample period in which a kernel ran", gpu, registry=r)
        self.gpu_memory_used = Gauge("vlmdata_gpu_memory_used_bytes", "Device memory in use (NVML, all processes)",
                                     gpu, registry=r)
        self.gpu_memory_peak = Gauge("vlmdata_gpu_memory_peak_bytes", "Largest device memory in use sampled this run",
                                     gpu, registry=r)
        self.gpu_memory_total = Gauge("vlmdata_gpu_memory_total_bytes", "Device memory size", gpu, registry=r)
        self.gpu_max_allocated = Gauge("vlmdata_gpu_max_memory_allocated_bytes",
                                       "torch.cuda.max_memory_allocated of this rank's process", rank, registry=r)
        # cache
        self.cache_hits = PCounter("vlmdata_cache_hits_total", "Cache lookups served, by tier", ["tier"], registry=r)
        self.cache_misses = PCounter("vlmdata_cache_misses_total", "Cache lookups not served, by tier", ["tier"], registry=r)
        self.fetch_bytes = PCounter("vlmdata_fetch_bytes_total", "Bytes read, by tier", ["tier"], registry=r)
        self.evictions = PCounter("vlmdata_cache_evictions_total", "Entries evicted, by tier", ["tier"], registry=r)
        self.prefetch_lead = Gauge("vlmdata_prefetch_lead_items", "Items fetched ahead of the reader", registry=r)
        self.inflight = Gauge("vlmdata_inflight_fetches", "Remote fetches in progress", registry=r)
        self.cache_bytes = Gauge("vlmdata_cache_bytes", "Bytes held, by tier", ["tier"], registry=r)
        self.cache_budget = Gauge("vlmdata_cache_budget_bytes", "Configured budget, by tier", ["tier"], registry=r)
        self.cache_budget_needed = Gauge("vlmdata_cache_budget_needed_bytes",
                                         "SSD budget the readers' windows need (window x readers x largest shard)",
                                         registry=r)
        self.cache_read_through = PCounter("vlmdata_cache_read_through_total",
                                           "Gets served without caching (pinned entries fill the budget)", registry=r)

    def _by_rank(self, metric, rank: int | str, **labels):
        """The child of a rank-labelled metric (the rank is dropped when rank_labels is off)."""
        if self.rank_labels:
            labels["rank"] = str(rank)
        return metric.labels(**labels) if labels else metric

    def absorb(self, delta: StatsDelta | Mapping, rank: int | str = 0) -> None:
        """Add a worker's counts (carried by a pack, as a StatsDelta or its dict) to this process's metrics."""
        if not isinstance(delta, StatsDelta):
            delta = StatsDelta.from_dict(delta)
        for attr, metric in (("samples", self.samples), ("images", self.images),
                             ("real_tokens", self.real_tokens), ("padded_tokens", self.padded_tokens),
                             ("packs", self.packs), ("truncated", self.truncated),
                             ("decode_seconds", self.decode_seconds), ("compute_flops", self.compute_flops)):
            value = getattr(delta, attr)
            if value:
                self._by_rank(metric, rank).inc(value)
        for reason, n in delta.skipped.items():
            self._by_rank(self.skipped, rank, reason=str(reason)).inc(n)
        for attr, metric in (("cache_hits", self.cache_hits), ("cache_misses", self.cache_misses),
                             ("fetch_bytes", self.fetch_bytes), ("evictions", self.evictions)):
            for tier, n in getattr(delta, attr).items():
                metric.labels(tier=str(tier)).inc(n)
        if delta.prefetch_lead is not None:
            self.prefetch_lead.set(delta.prefetch_lead)
        if delta.step_imbalance is not None:
            self._by_rank(self.step_imbalance, rank).observe(delta.step_imbalance)

    def observe_wait(self, seconds: float, rank: int | str = 0) -> None:
        """Time the consumer spent blocked waiting for the next batch."""
        self._by_rank(self.data_wait_seconds, rank).inc(max(0.0, seconds))

    def observe_step(self, seconds: float, rank: int | str = 0) -> None:
        """One completed training step (data wait included)."""
        seconds = max(0.0, seconds)
        self._by_rank(self.step_seconds, rank).inc(seconds)
        self._by_rank(self.steps, rank).inc()
        self._by_rank(self.step_time, rank).observe(seconds)

    def observe_phases(self, seconds: Mapping[str, float], rank: int | str = 0) -> None:
        """A profiled window's seconds per phase (pipelines' step breakdown)."""
        for name, value in seconds.items():
            if value > 0:
                self._by_rank(self.phase_seconds, rank, phase=str(name)).inc(value)

    def observe_optimizer(self, grad_norm: float, lr: float, rank: int | str = 0) -> None:
        """The last step's gradient norm (before clipping) and learning rate."""
        self._by_rank(self.grad_norm, rank).set(grad_norm)
        self._by_rank(self.learning_rate, rank).set(lr)

    def observe_allreduce(self, nbytes: int, rank: int | str = 0) -> None:
        """Bytes the gradient communication hook all-reduced (this rank's payload)."""
        if nbytes:
            self._by_rank(self.allreduce_bytes, rank).inc(nbytes)

    def observe_gpu(self, sample: Mapping, rank: int | str = 0) -> None:
        """A GPU reading: `gpu` (label), `utilization` (0-1), `memory_used`, `memory_peak`, `memory_total`
        (bytes; None without NVML) and `max_allocated` (torch's allocator peak, bytes)."""
        gpu = str(sample["gpu"])
        for key, metric in (("utilization", self.gpu_utilization), ("memory_used", self.gpu_memory_used),
                            ("memory_peak", self.gpu_memory_peak), ("memory_total", self.gpu_memory_total)):
            if sample.get(key) is not None:
                self._by_rank(metric, rank, gpu=gpu).set(sample[key])
        if sample.get("max_allocated") is not None:
            self._by_rank(self.gpu_max_allocated, rank).set(sample["max_allocated"])

    def record_fetch(self, tier: str, hit: bool, nbytes: int = 0) -> None:
        """A cache lookup in `tier` (daemon or in-process cache); `nbytes` read from that tier."""
        (self.cache_hits if hit else self.cache_misses).labels(tier=tier).inc()
        if nbytes:
            self.fetch_bytes.labels(tier=tier).inc(nbytes)


def exported_series(metrics: MetricSet) -> dict[str, tuple[str, ...]]:
    """Every series name the registry can export, mapped to its label names.

    Counters export `<name>_total`, histograms `_bucket` (plus label `le`), `_sum`
    and `_count`; used to check dashboards only query metrics that exist.
    """
    out: dict[str, tuple[str, ...]] = {}
    for collector in vars(metrics).values():
        if not isinstance(collector, MetricWrapperBase):
            continue
        # prometheus_client keeps these private; its public describe() drops the label names.
        labels = tuple(collector._labelnames)
        kind = collector._type
        base = collector._name
        if kind == "counter":
            out[f"{base}_total"] = labels
        elif kind == "histogram":
            out[f"{base}_bucket"] = labels + ("le",)
            out[f"{base}_sum"] = labels
            out[f"{base}_count"] = labels
        else:
            out[base] = labels
    return out
