"""Every Prometheus metric of vlmdata, defined once.

Names follow Prometheus conventions (base units, `_seconds`, `_bytes`,
`_total`). Metrics live in a `MetricSet` bound to one registry, so tests and
several pipelines in one process never collide and there is no global state
beyond prometheus_client's optional default registry.

DataLoader workers do not touch the registry: they attach their counts to
each pack (`PackedBatch["stats"]`, see `StatsDelta`) and the consuming
process adds them with `MetricSet.absorb`. Counts therefore survive worker
exit and there are no per-process files to grow.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter as PCounter, Gauge, Histogram

TIERS = ("memory", "disk", "remote")


class MetricSet:
    """All vlmdata metrics registered on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None, rank_labels: bool = True):
        self.registry = registry if registry is not None else CollectorRegistry()
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
        # training loop
        self.data_wait_seconds = PCounter("vlmdata_data_wait_seconds_total", "Seconds the consumer waited for data", rank, registry=r)
        self.step_seconds = PCounter("vlmdata_step_seconds_total", "Seconds in training steps, data wait included", rank, registry=r)
        self.steps = PCounter("vlmdata_steps_total", "Training steps completed", rank, registry=r)
        self.step_time = Histogram("vlmdata_step_duration_seconds", "Duration of one training step", rank, registry=r,
                                   buckets=(0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30))
        # cache
        self.cache_hits = PCounter("vlmdata_cache_hits_total", "Cache lookups served, by tier", ["tier"], registry=r)
        self.cache_misses = PCounter("vlmdata_cache_misses_total", "Cache lookups not served, by tier", ["tier"], registry=r)
        self.fetch_bytes = PCounter("vlmdata_fetch_bytes_total", "Bytes read, by tier", ["tier"], registry=r)
        self.evictions = PCounter("vlmdata_cache_evictions_total", "Entries evicted, by tier", ["tier"], registry=r)
        self.prefetch_lead = Gauge("vlmdata_prefetch_lead_items", "Items fetched ahead of the reader", registry=r)
        self.inflight = Gauge("vlmdata_inflight_fetches", "Remote fetches in progress", registry=r)
        self.cache_bytes = Gauge("vlmdata_cache_bytes", "Bytes held, by tier", ["tier"], registry=r)

    def absorb(self, delta: StatsDelta, rank: int | str = 0) -> None:
        """Add a worker's counts (carried by a pack) to this process's metrics."""
        lab = {"rank": str(rank)}
        self.samples.labels(**lab).inc(delta.samples)
        self.images.labels(**lab).inc(delta.images)
        self.real_tokens.labels(**lab).inc(delta.real_tokens)
        self.padded_tokens.labels(**lab).inc(delta.padded_tokens)
        self.packs.labels(**lab).inc(delta.packs)
        self.truncated.labels(**lab).inc(delta.truncated)
        self.decode_seconds.labels(**lab).inc(delta.decode_seconds)
        for reason, n in delta.skipped.items():
            self.skipped.labels(reason=reason, **lab).inc(n)


@dataclass
class StatsDelta:
    """Counts produced while making one pack; plain data, travels with the pack."""

    samples: int = 0
    images: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    packs: int = 0
    truncated: int = 0
    decode_seconds: float = 0.0
    skipped: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict:
        return {"samples": self.samples, "images": self.images, "real_tokens": self.real_tokens,
                "padded_tokens": self.padded_tokens, "packs": self.packs, "truncated": self.truncated,
                "decode_seconds": self.decode_seconds, "skipped": dict(self.skipped)}

    @classmethod
    def from_dict(cls, d: dict) -> StatsDelta:
        d = dict(d)
        d["skipped"] = Counter(d.get("skipped", {}))
        return cls(**d)
