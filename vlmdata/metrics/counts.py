"""Counts made while producing a pack, as plain data that travels with it (no prometheus_client here).

DataLoader workers import this module only, never the registry: their counts
ride along in `PackedBatch["stats"]` and the consuming process adds them to its
`MetricSet` (`vlmdata.metrics.registry`).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["TIERS", "StatsDelta", "StatsReporter", "take_fetch_stats"]

TIERS = ("memory", "disk", "remote")


def _add_counts(into: Counter, other: Mapping) -> None:
    for k, v in other.items():
        into[k] += v


@dataclass
class StatsDelta:
    """Counts produced while making one pack; plain data, travels with the pack.

    The per-tier fields (`cache_hits`, `cache_misses`, `fetch_bytes`, `evictions`)
    map a tier name (see TIERS) to a count; `prefetch_lead` is the latest value of
    the gauge (None = not measured). `compute_flops` is the packs' cost under a balanced
    plan (plan.balance), `step_imbalance` the latest pack's step's slowest / mean rank cost.
    """

    samples: int = 0
    images: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    packs: int = 0
    truncated: int = 0
    decode_seconds: float = 0.0
    compute_flops: float = 0.0
    skipped: Counter = field(default_factory=Counter)
    cache_hits: Counter = field(default_factory=Counter)
    cache_misses: Counter = field(default_factory=Counter)
    fetch_bytes: Counter = field(default_factory=Counter)
    evictions: Counter = field(default_factory=Counter)
    prefetch_lead: float | None = None
    step_imbalance: float | None = None

    _LATEST = ("prefetch_lead", "step_imbalance")
    _COUNTERS = ("skipped", "cache_hits", "cache_misses", "fetch_bytes", "evictions")
    _SCALARS = ("samples", "images", "real_tokens", "padded_tokens", "packs", "truncated", "decode_seconds", "compute_flops")

    def record_fetch(self, tier: str, hit: bool, nbytes: int = 0) -> None:
        """Count one cache lookup in `tier`; `nbytes` read from that tier."""
        (self.cache_hits if hit else self.cache_misses)[tier] += 1
        if nbytes:
            self.fetch_bytes[tier] += nbytes

    def merge(self, other: StatsDelta | None) -> StatsDelta:
        """Add `other`'s counts into this delta (in place) and return self."""
        if other is None:
            return self
        for name in self._SCALARS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in self._COUNTERS:
            _add_counts(getattr(self, name), getattr(other, name))
        for name in self._LATEST:
            if getattr(other, name) is not None:
                setattr(self, name, getattr(other, name))
        return self

    def is_empty(self) -> bool:
        return (not any(getattr(self, n) for n in self._SCALARS + self._COUNTERS)
                and all(getattr(self, n) is None for n in self._LATEST))

    def to_dict(self) -> dict:
        d = {name: getattr(self, name) for name in self._SCALARS}
        d.update({name: dict(getattr(self, name)) for name in self._COUNTERS})
        d.update({name: getattr(self, name) for name in self._LATEST})
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> StatsDelta:
        """Inverse of to_dict; missing keys take their defaults, unknown keys are an error."""
        d = dict(d)
        unknown = set(d) - set(cls._SCALARS) - set(cls._COUNTERS) - set(cls._LATEST)
        if unknown:
            raise ValueError(f"unknown StatsDelta fields: {sorted(unknown)}")
        for name in cls._COUNTERS:
            d[name] = Counter(_plain(d.get(name) or {}))
        for name in cls._SCALARS:
            if name in d:
                d[name] = _plain(d[name])
        for name in cls._LATEST:
            if d.get(name) is not None:
                d[name] = float(_plain(d[name]))
        return cls(**d)


def _plain(value):
    """Turn tensors/numpy scalars (a DataLoader may convert them) back into Python numbers."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    item = getattr(value, "item", None)
    return item() if callable(item) else value


@runtime_checkable
class StatsReporter(Protocol):
    """A component that gathers counts (a worker-side cache) and hands them over to ride along with packs."""

    def take_stats(self) -> StatsDelta | dict | None:
        """The counts gathered since the last call, reset to zero; None when there are none."""
        ...


def take_fetch_stats(fetcher: object) -> StatsDelta | None:
    """The counts `fetcher` gathered since the last call, when it is a `StatsReporter`; else None."""
    if not isinstance(fetcher, StatsReporter):
        return None
    got = fetcher.take_stats()
    if got is None or isinstance(got, StatsDelta):
        return got
    return StatsDelta.from_dict(got)
