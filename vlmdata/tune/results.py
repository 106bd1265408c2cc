"""What the auto-tuner measured: one run (Measurement), one setting's runs (Candidate), the outcome (TuneResult)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from vlmdata.tune.settings import LoaderSettings

__all__ = ["Candidate", "Measurement", "TuneResult"]


@dataclass
class Measurement:
    """One run of the pipeline at one setting."""

    settings: LoaderSettings
    batches: int = 0
    images: int = 0
    tokens: int = 0
    seconds: float = 0.0
    startup_s: float = 0.0
    wall_s: float = 0.0                 # whole run: start, warm-up, measurement, shutdown
    chunk_rates: dict[str, list[float]] = field(default_factory=dict)  # objective -> rate per time chunk
    worker_pss: list[int] = field(default_factory=list)      # peak PSS per worker, bytes
    worker_rss: list[int] = field(default_factory=list)
    worker_uss: list[int] = field(default_factory=list)      # peak private memory per worker, bytes
    main_growth: int = 0                # consumer PSS growth during the run, bytes
    consumer_cores: float = 0.0         # CPUs the consumer load really kept busy meanwhile
    phase: str = ""
    note: str = ""
    error: str | None = None
    stopped_early: bool = False

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds if self.seconds > 0 else 0.0

    @property
    def memory_bytes(self) -> int:
        """What the budget is checked against: workers' peak PSS plus the consumer's growth."""
        return sum(self.worker_pss) + max(0, self.main_growth)

    def rate(self, objective: str) -> float:
        return {"tokens": self.tokens_per_s, "images": self.images_per_s,
                "batches": self.batches_per_s}[objective]

    def rel_noise(self, objective: str) -> float:
        """Relative standard error of the rate, from its per-chunk rates (0 when unknown)."""
        r = self.chunk_rates.get(objective, [])
        if len(r) < 2:
            return 0.0
        mean = sum(r) / len(r)
        if mean <= 0:
            return 0.0
        var = sum((x - mean) ** 2 for x in r) / (len(r) - 1)
        return math.sqrt(var / len(r)) / mean

    def to_dict(self) -> dict:
        d = asdict(self)
        d["settings"] = self.settings.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Measurement:
        d = dict(d)
        d["settings"] = LoaderSettings.from_dict(d["settings"])
        return cls(**d)


@dataclass
class Candidate:
    """All measurements of one setting, combined."""

    settings: LoaderSettings
    runs: list[Measurement] = field(default_factory=list)

    def ok_runs(self) -> list[Measurement]:
        return [m for m in self.runs if m.error is None]

    def rate(self, objective: str) -> float:
        """Pooled rate of the complete runs (an early-stopped run counts only if nothing better)."""
        full = [m for m in self.ok_runs() if not m.stopped_early] or self.ok_runs()
        secs = sum(m.seconds for m in full)
        if secs <= 0:
            return 0.0
        return sum(m.rate(objective) * m.seconds for m in full) / secs

    def rel_noise(self, objective: str) -> float:
        runs = self.ok_runs()
        if not runs:
            return 0.0
        rates = [m.rel_noise(objective) for m in runs]
        return math.sqrt(sum(r * r for r in rates)) / len(rates)

    def memory_bytes(self) -> int:
        return max((m.memory_bytes for m in self.runs), default=0)

    def worker_private_bytes(self) -> int:
        """Largest private (USS) memory of one worker over the runs: what one more worker adds."""
        return max((max(m.worker_uss, default=0) for m in self.runs), default=0)

    @property
    def failed(self) -> bool:
        return not self.ok_runs()


@dataclass
class TuneResult:
    """What a tuning run produced: the choice, why, and everything measured."""

    settings: LoaderSettings
    reason: str
    objective: str
    measurements: list[Measurement]
    cpu_count: int
    memory_budget: int
    elapsed_s: float
    from_cache: bool = False
    confidence: str = ""                # how sure the choice is (see search.AdaptiveSearch.confidence)
    consumer_cores: float = 0.0         # the consumer load it was measured with

    def to_dict(self) -> dict:
        return {"settings": self.settings.to_dict(), "reason": self.reason, "objective": self.objective,
                "measurements": [m.to_dict() for m in self.measurements], "cpu_count": self.cpu_count,
                "memory_budget": self.memory_budget, "elapsed_s": self.elapsed_s, "confidence": self.confidence,
                "consumer_cores": self.consumer_cores}

    @classmethod
    def from_dict(cls, d: dict, from_cache: bool = False) -> TuneResult:
        return cls(settings=LoaderSettings.from_dict(d["settings"]), reason=d["reason"],
                   objective=d["objective"], measurements=[Measurement.from_dict(m) for m in d["measurements"]],
                   cpu_count=d["cpu_count"], memory_budget=d["memory_budget"], elapsed_s=d["elapsed_s"],
                   from_cache=from_cache, confidence=d.get("confidence", ""),
                   consumer_cores=d.get("consumer_cores", 0.0))
