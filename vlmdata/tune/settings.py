"""What the auto-tuner chooses (LoaderSettings) and how it is told to search (TuneBudget, TuneConfig)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

import torch

__all__ = ["LoaderSettings", "ThreadTunable", "TuneBudget", "TuneConfig", "WorkerThreads", "apply_decode_threads"]


@dataclass(frozen=True)
class LoaderSettings:
    """How a DataLoader is run: what the tuner chooses and `make_loader` applies.

    `decode_threads` is applied inside each worker by `WorkerThreads` (torch
    intra-op threads, plus `dataset.set_decode_threads(n)` when the dataset
    exposes it). `prefetch_factor` is None when `num_workers == 0`.
    """

    num_workers: int = 0
    prefetch_factor: int | None = None
    decode_threads: int = 1
    pin_memory: bool = False

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.num_workers == 0 and self.prefetch_factor is not None:
            object.__setattr__(self, "prefetch_factor", None)
        if self.num_workers > 0 and self.prefetch_factor is None:
            object.__setattr__(self, "prefetch_factor", 2)
        if self.prefetch_factor is not None and self.prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be >= 1, got {self.prefetch_factor}")
        if self.decode_threads < 1:
            raise ValueError(f"decode_threads must be >= 1, got {self.decode_threads}")

    def loader_kwargs(self) -> dict:
        """Keyword arguments for `torch.utils.data.DataLoader` (batch_size is the caller's)."""
        kwargs: dict = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kwargs["prefetch_factor"] = self.prefetch_factor
            kwargs["worker_init_fn"] = WorkerThreads(self.decode_threads)
        return kwargs

    def label(self) -> str:
        pf = "-" if self.prefetch_factor is None else str(self.prefetch_factor)
        return f"w={self.num_workers} pf={pf} t={self.decode_threads} pin={int(self.pin_memory)}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LoaderSettings:
        return cls(**{k: d[k] for k in ("num_workers", "prefetch_factor", "decode_threads", "pin_memory") if k in d})


class WorkerThreads:
    """DataLoader `worker_init_fn` that applies the decode-thread setting in each worker.

    Sets torch's intra-op threads (DataLoader workers default to 1) and calls
    `dataset.set_decode_threads(n)` on the worker's dataset copy when it has one.
    `chain` is an optional further init function called afterwards.
    """

    def __init__(self, threads: int, chain=None):
        self.threads = threads
        self.chain = chain

    def __call__(self, worker_id: int) -> None:
        torch.set_num_threads(self.threads)
        info = torch.utils.data.get_worker_info()
        if info is not None:
            apply_decode_threads(info.dataset, self.threads)
        if self.chain is not None:
            self.chain(worker_id)


@runtime_checkable
class ThreadTunable(Protocol):
    """A dataset whose image decoding can use several threads (VLMDataset is one)."""

    @property
    def decode_threads(self) -> int:
        """The threads each pack's images are decoded with."""
        ...

    def set_decode_threads(self, threads: int) -> None:
        ...


def apply_decode_threads(dataset, threads: int) -> bool:
    """`dataset.set_decode_threads(threads)` when the dataset is `ThreadTunable`; True if it was."""
    if isinstance(dataset, ThreadTunable):
        dataset.set_decode_threads(threads)
        return True
    return False


@dataclass(frozen=True)
class TuneBudget:
    """Limits for tuning: memory the loader may use, wall time the search may take.

    `memory_bytes` bounds the measured loader memory (sum of the workers' peak
    PSS plus the consumer's growth); None = half the machine's memory divided by
    the local ranks. `time_s` bounds the whole search (best-so-far is used).
    """

    memory_bytes: int | None = None
    time_s: float = 120.0


@dataclass(frozen=True)
class TuneConfig:
    """How candidates are measured and compared.

    warmup_batches: discarded after each worker's first batch (which carries its start-up).
    measure_s / min_batches / max_batches: one measurement window.
    min_gain: a larger worker count must beat the best so far by this fraction to keep growing.
    plateau_tol: candidates within this fraction of the best count as equal; the cheapest wins.
    early_stop: stop measuring a candidate once it is clearly (> this fraction) below the best.
    screen_fraction: exploring runs measure for this fraction of measure_s; the leaders are then
        re-measured for the full measure_s (confirm) and all their runs pooled (successive halving).
    confirm_top: re-measure this many leading candidates (interleaved) before choosing.
    cpu_count: CPUs this loader may use (None: detected, divided by local ranks).
    objective: "tokens", "images" or "batches" per second (None: tokens if counted, else images).
    max_prefetch: largest prefetch depth tried.
    consumer_cores: CPUs the training step keeps busy, emulated in the measuring process during every
        measurement (`tune.consumer.ConsumerLoad`); 0 measures the loader alone. More workers than
        CPUs are chosen only when they measured clearly faster with this load running.
    """

    warmup_batches: int = 2
    measure_s: float = 2.0
    min_batches: int = 6
    max_batches: int = 100_000
    min_gain: float = 0.05
    plateau_tol: float = 0.02
    early_stop: float = 0.25
    screen_fraction: float = 0.5
    confirm_top: int = 2
    cpu_count: int | None = None
    objective: str | None = None
    max_prefetch: int = 8
    tune_pin_memory: bool | None = None   # None: only when CUDA is available
    consumer_cores: float = 1.0
