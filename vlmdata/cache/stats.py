"""Plain cache counters, optionally mirrored into a MetricSet.

DataLoader workers keep plain counters (`CacheStats.to_dict()`); only a process that owns a
registry (the cache daemon, or a single-process loader) passes a MetricSet to mirror into.
Without a MetricSet, `take()` hands the counts since its last call to the dataset as a
`StatsDelta` (the same series the MetricSet would get), which rides along with the next pack.
"""
from __future__ import annotations

import threading
from collections import Counter

from vlmdata.metrics.counts import StatsDelta
from vlmdata.metrics.registry import MetricSet


class CacheStats:
    """Hits and misses per tier, remote fetches and bytes, evictions, prefetch activity."""

    def __init__(self, metrics: MetricSet | None = None):
        self.metrics = metrics
        self._lock = threading.Lock()
        self.hits: Counter = Counter()        # tier -> demand gets served by that tier
        self.misses: Counter = Counter()      # tier -> demand gets that tier could not serve
        self.evictions: Counter = Counter()   # tier -> entries evicted
        self.bytes_served: Counter = Counter()  # tier -> bytes handed to readers
        self.remote_fetches = 0               # objects fetched from the store (demand + prefetch)
        self.remote_bytes = 0
        self.prefetch_fetches = 0
        self.joined = 0                       # gets that waited on a fetch already in flight
        self.corrupt_discarded = 0            # SSD entries that failed verification
        self.fetch_errors = 0
        self.read_through = 0                 # gets served without caching: pinned entries filled the budget
        self.inflight = 0
        self.prefetch_lead = 0
        self._delta = StatsDelta()            # what a MetricSet would have received since take()

    def hit(self, tier: str, nbytes: int) -> None:
        with self._lock:
            self.hits[tier] += 1
            self.bytes_served[tier] += nbytes
            self._delta.record_fetch(tier, True, nbytes)
        if self.metrics:
            self.metrics.cache_hits.labels(tier=tier).inc()
            self.metrics.fetch_bytes.labels(tier=tier).inc(nbytes)

    def miss(self, tier: str) -> None:
        with self._lock:
            self.misses[tier] += 1
            self._delta.record_fetch(tier, False)
        if self.metrics:
            self.metrics.cache_misses.labels(tier=tier).inc()

    def evicted(self, tier: str, n: int = 1) -> None:
        with self._lock:
            self.evictions[tier] += n
            self._delta.evictions[tier] += n
        if self.metrics:
            self.metrics.evictions.labels(tier=tier).inc(n)

    def fetched(self, nbytes: int, prefetch: bool) -> None:
        with self._lock:
            self.remote_fetches += 1
            self.remote_bytes += nbytes
            self.prefetch_fetches += int(prefetch)
            if prefetch:
                self._delta.fetch_bytes["remote"] += nbytes
        if self.metrics and prefetch:  # demand fetches are counted by hit("remote")
            self.metrics.fetch_bytes.labels(tier="remote").inc(nbytes)

    def count(self, field: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, field, getattr(self, field) + n)
        if self.metrics and field == "read_through":
            self.metrics.cache_read_through.inc(n)

    def set_inflight(self, delta: int) -> None:
        with self._lock:
            self.inflight += delta
            value = self.inflight
        if self.metrics:
            self.metrics.inflight.set(value)

    def set_lead(self, lead: int) -> None:
        self.prefetch_lead = lead
        with self._lock:
            self._delta.prefetch_lead = float(lead)
        if self.metrics:
            self.metrics.prefetch_lead.set(lead)

    def set_bytes(self, tier: str, nbytes: int) -> None:
        if self.metrics:
            self.metrics.cache_bytes.labels(tier=tier).set(nbytes)

    def take(self) -> StatsDelta | None:
        """Counts since the last call as a StatsDelta, then reset them; None when a MetricSet
        already receives them (so nothing reaches Prometheus twice)."""
        with self._lock:
            out, self._delta = self._delta, StatsDelta()
        return None if self.metrics is not None else out

    def to_dict(self) -> dict:
        with self._lock:
            return {"hits": dict(self.hits), "misses": dict(self.misses), "evictions": dict(self.evictions),
                    "bytes_served": dict(self.bytes_served), "remote_fetches": self.remote_fetches,
                    "remote_bytes": self.remote_bytes, "prefetch_fetches": self.prefetch_fetches,
                    "joined": self.joined, "corrupt_discarded": self.corrupt_discarded,
                    "fetch_errors": self.fetch_errors, "read_through": self.read_through, "inflight": self.inflight,
                    "prefetch_lead": self.prefetch_lead}
