"""Running a real loading pipeline briefly at one setting and measuring what the consumer receives.

The tuner talks to a `PipelineRunner`; `LoaderRunner` is the real one: it
builds a `torch.utils.data.DataLoader` over the dataset, repeated without end
(`LoopedDataset`: a measurement never stops because the data ran out), with
the candidate settings, while `ConsumerLoad` keeps `plan.consumer_cores` CPUs
busy in this process as the training step would. It discards the warm-up
(worker start-up: each worker's first batch, plus `warmup_batches`), then
counts images and tokens delivered for a fixed time, while a thread samples
the workers' memory from /proc.
"""
from __future__ import annotations

import gc
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from vlmdata.loading.dataloader import build_dataloader
from vlmdata.tune.consumer import ConsumerLoad
from vlmdata.tune.looping import LoopedDataset
from vlmdata.tune.memory import MemorySampler, read_proc_mem
from vlmdata.tune.results import Measurement
from vlmdata.tune.settings import LoaderSettings, ThreadTunable, apply_decode_threads

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MeasurePlan:
    """How long to run one candidate.

    stop_below: objective rate under which the run may end early (the
    candidate is clearly worse than the best so far); None = never.
    consumer_cores: CPUs kept busy in the measuring process meanwhile (the training step's share).
    """

    objective: str = "tokens"
    warmup_batches: int = 2
    measure_s: float = 2.0
    min_batches: int = 6
    max_batches: int = 100_000
    stop_below: float | None = None
    chunks: int = 5
    consumer_cores: float = 0.0


class PipelineRunner(Protocol):
    """Something that can run a pipeline at a setting and measure it.

    `tunes_threads`: whether decode threads change anything for this pipeline (the search
    skips that dimension otherwise).
    """

    tunes_threads: bool

    def measure(self, settings: LoaderSettings, plan: MeasurePlan) -> Measurement:
        ...


def count_batch(batch) -> tuple[int, int]:
    """(images, tokens) in one batch: from `batch["stats"]` when present, else from the tensors."""
    if isinstance(batch, dict):
        stats = batch.get("stats")
        if isinstance(stats, dict) and ("images" in stats or "real_tokens" in stats):
            return int(stats.get("images", 0)), int(stats.get("real_tokens", 0))
        tokens = 0
        ids = batch.get("input_ids")
        if isinstance(ids, torch.Tensor):
            tokens = int(ids.numel())
        images = 0
        grid = batch.get("image_grid")
        pix = batch.get("pixel_values")
        if isinstance(grid, torch.Tensor) and grid.ndim >= 1:
            images = int(grid.shape[0])
        elif isinstance(pix, torch.Tensor) and pix.ndim == 4:
            images = int(pix.shape[0])
        return images, tokens
    return 0, 0


def default_build(dataset, settings: LoaderSettings, timeout_s: float) -> Iterable:
    """The loader `make_loader` would build at `settings` (batch_size=None: the dataset yields batches)."""
    kwargs = settings.loader_kwargs()
    if settings.num_workers > 0:
        kwargs["timeout"] = timeout_s
    return build_dataloader(dataset, **kwargs)


class LoaderRunner:
    """Measures a dataset through a real DataLoader.

    `build(dataset, settings, timeout_s)` makes the loader (default: a plain
    DataLoader with `settings.loader_kwargs()`); `count(batch) -> (images,
    tokens)`. `calls` counts measurements, so callers can tell whether any ran.
    `loop`: measure over the dataset repeated without end (`LoopedDataset`).
    """

    def __init__(self, dataset, build: Callable | None = None,
                 count: Callable = count_batch, timeout_s: float = 120.0, loop: bool = True):
        self.dataset = dataset
        self.loop = loop
        self.build = build or default_build
        self.count = count
        self.timeout_s = timeout_s
        self.calls = 0
        # decode threads matter only where the dataset can use them (else torch's intra-op threads,
        # which a loading pipeline barely uses): the search skips that dimension otherwise
        self.tunes_threads = isinstance(dataset, ThreadTunable)

    def measure(self, settings: LoaderSettings, plan: MeasurePlan) -> Measurement:
        self.calls += 1
        m = Measurement(settings=settings)
        previous_threads = self.dataset.decode_threads if self.tunes_threads else None
        if settings.num_workers == 0:
            apply_decode_threads(self.dataset, settings.decode_threads)
        gc.collect()
        base = read_proc_mem(os.getpid())
        sampler = MemorySampler().start()
        t0 = time.perf_counter()
        it = None
        load = ConsumerLoad(plan.consumer_cores)
        data = LoopedDataset(self.dataset) if self.loop else self.dataset
        try:
            with warnings.catch_warnings(), load:
                # torch warns when workers exceed its CPU guess; measuring that is the point here
                warnings.filterwarnings("ignore", message=".*excessive worker creation.*")
                it = iter(self.build(data, settings, self.timeout_s))
                _run(it, m, plan, self.count, t0)
        except (RuntimeError, OSError, ValueError) as exc:    # a worker died, a bad setting: keep tuning
            m.error = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("tune: %s failed: %s", settings.label(), m.error)
        finally:
            peaks = sampler.stop()
            m.consumer_cores = load.achieved_cores
            del it                       # shuts the workers down
            m.wall_s = time.perf_counter() - t0
            if settings.num_workers == 0 and previous_threads is not None:
                apply_decode_threads(self.dataset, previous_threads)   # leave the caller's dataset as it was
        m.worker_pss = [p.pss for p in peaks.workers.values()]
        m.worker_rss = [p.rss for p in peaks.workers.values()]
        m.worker_uss = [p.uss for p in peaks.workers.values()]
        m.main_growth = peaks.main_pss - base.pss if base is not None else 0
        return m


def _run(it, m: Measurement, plan: MeasurePlan, count: Callable, t0: float) -> None:
    """Warm up, then measure; fills `m` in place.

    A DataLoader hands out batches round-robin over its workers, in order, so
    they arrive in rounds of `num_workers` gated by the slowest worker. The
    warm-up (each worker's first batch, which carries its start-up, plus
    `warmup_batches`) and the measurement both end on a round boundary;
    otherwise a window ending inside a burst would over- or under-count.
    """
    rnd = max(1, m.settings.num_workers)
    warmup = rnd * -(-(plan.warmup_batches + rnd) // rnd)
    for i in range(warmup):
        try:
            next(it)
        except StopIteration:
            raise ValueError(f"the dataset ended during warm-up ({i} batches): use a larger dataset") from None
        if i == 0:
            m.startup_s = time.perf_counter() - t0
    times: list[float] = []
    values: dict[str, list[float]] = {"tokens": [], "images": [], "batches": []}
    start = time.perf_counter()
    while len(times) < plan.max_batches:
        try:
            batch = next(it)
        except StopIteration:
            m.note = "dataset ended"
            break
        n_img, n_tok = count(batch)
        now = time.perf_counter()
        times.append(now - start)
        values["tokens"].append(n_tok)
        values["images"].append(n_img)
        values["batches"].append(1)
        if len(times) % rnd:
            continue
        elapsed = now - start
        if len(times) >= plan.min_batches and elapsed >= plan.measure_s:
            break
        if (plan.stop_below is not None and len(times) >= max(2, plan.min_batches // 2)
                and elapsed >= plan.measure_s / 3 and sum(values[plan.objective]) / elapsed < plan.stop_below):
            m.stopped_early = True
            break
    keep = len(times) - len(times) % rnd if len(times) >= rnd else len(times)
    times = times[:keep]
    values = {k: v[:keep] for k, v in values.items()}
    if len(times) < 2:
        raise ValueError("fewer than 2 batches measured: use a larger dataset or a longer measure time")
    images, tokens = int(sum(values["images"])), int(sum(values["tokens"]))
    m.batches, m.images, m.tokens = len(times), images, tokens
    m.seconds = times[-1]
    m.chunk_rates = {k: _chunk_rates(times, v, plan.chunks) for k, v in values.items()}


def _chunk_rates(times: list[float], values: list[float], chunks: int) -> list[float]:
    """Objective rate in `chunks` equal time slices of the measured window."""
    total = times[-1]
    k = max(1, min(chunks, len(times) // 3))
    if total <= 0:
        return []
    edges = [total * (i + 1) / k for i in range(k)]
    rates, acc, j, prev = [], 0.0, 0, 0.0
    for t, v in zip(times, values):
        while j < k - 1 and t > edges[j]:
            rates.append(acc / (edges[j] - prev))
            prev, acc, j = edges[j], 0.0, j + 1
        acc += v
    rates.append(acc / (total - prev) if total > prev else 0.0)
    return rates
