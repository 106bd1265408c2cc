"""Worker auto-tuner: picks DataLoader workers, prefetch depth, decode threads and pinning.

    from vlmdata.tune.tuner import auto_loader_settings
    settings = auto_loader_settings(ds)             # cached per (machine, dataset, pipeline settings)
    loader = DataLoader(ds, batch_size=None, **settings.loader_kwargs())

`vlmdata.make_loader(ds, num_workers="auto")` does exactly this. The search
(`search.py`) runs the real pipeline briefly at each candidate through a
`PipelineRunner` (`measure.LoaderRunner` by default), so any runner with a
known optimum can test it. Parts of `vlmdata.tune`: settings and results
(data), measure (running), memory (sampling /proc), search, result_cache
(fingerprints and the on-disk cache), and this module, which ties them together.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict

import torch

from vlmdata.tune.measure import LoaderRunner, PipelineRunner
from vlmdata.tune.result_cache import (
    TuneCache,
    cache_key,
    dataset_fingerprint,
    local_world_size,
    machine_fingerprint,
    total_memory,
    usable_cpus,
)
from vlmdata.tune.results import Measurement, TuneResult
from vlmdata.tune.search import AdaptiveSearch, make_space
from vlmdata.tune.settings import LoaderSettings, TuneBudget, TuneConfig

__all__ = ["LoaderSettings", "TuneBudget", "TuneConfig", "TuneResult", "auto_loader_settings",
           "format_table", "tune", "tune_cached"]

log = logging.getLogger(__name__)


def default_memory_budget() -> int:
    """Half the machine's memory, shared among the local ranks."""
    return total_memory() // 2 // local_world_size()


def tune(dataset=None, *, runner: PipelineRunner | None = None, budget: TuneBudget | None = None,
         config: TuneConfig | None = None) -> TuneResult:
    """Search the settings for `dataset` (or an explicit `runner`); no cache involved."""
    if runner is None:
        if dataset is None:
            raise ValueError("tune() needs a dataset or a runner")
        runner = LoaderRunner(dataset)
    budget = budget or TuneBudget()
    cfg = config or TuneConfig()
    cpus = cfg.cpu_count or usable_cpus()
    memory = budget.memory_bytes if budget.memory_bytes is not None else default_memory_budget()
    space = make_space(cpus, cfg, pin_available=torch.cuda.is_available(),
                       threads=runner.tunes_threads)
    t0 = time.perf_counter()
    search = AdaptiveSearch(runner, space, cfg, memory_budget=memory, time_budget_s=budget.time_s)
    chosen = search.run()
    reason = search.reason(chosen)
    if chosen is None:
        raise RuntimeError(f"auto-tuning found no usable loader setting: {reason}; "
                           "raise the memory budget or set num_workers explicitly")
    confidence = search.confidence(chosen)
    return TuneResult(settings=chosen.settings, reason=f"{reason}; confidence: {confidence}",
                      objective=search.objective, measurements=search.measurements, cpu_count=cpus,
                      memory_budget=memory, elapsed_s=time.perf_counter() - t0, confidence=confidence,
                      consumer_cores=cfg.consumer_cores)


def tune_cached(dataset, *, budget: TuneBudget | None = None, config: TuneConfig | None = None,
                cache_path: str | None = None, runner: PipelineRunner | None = None,
                force: bool = False) -> TuneResult:
    """The cached result for (machine, dataset, settings), tuning (and caching) on a miss or `force`."""
    budget = budget or TuneBudget()
    cfg = config or TuneConfig()
    cpus = cfg.cpu_count or usable_cpus()
    memory = budget.memory_bytes if budget.memory_bytes is not None else default_memory_budget()
    machine = machine_fingerprint(cpus)
    data_fp = dataset_fingerprint(dataset)
    extra = {"memory_budget": memory, "objective": cfg.objective, "max_prefetch": cfg.max_prefetch,
             "tune_pin_memory": cfg.tune_pin_memory, "consumer_cores": cfg.consumer_cores}
    key = cache_key(machine, data_fp, extra)
    cache = TuneCache(cache_path)
    with cache.locked():
        if not force:
            hit = cache.get(key)
            if hit is not None:
                log.info("tune: cached choice %s (%s)", hit.settings.label(), cache.path)
                return hit
        result = tune(dataset, runner=runner, budget=TuneBudget(memory, budget.time_s),
                      config=TuneConfig(**{**asdict(cfg), "cpu_count": cpus}))
        cache.put(key, result, {"machine": machine, "dataset": data_fp, "extra": extra})
    return result


def auto_loader_settings(dataset, budget: TuneBudget | None = None, *, config: TuneConfig | None = None,
                         cache_path: str | None = None, runner: PipelineRunner | None = None) -> LoaderSettings:
    """Loader settings for `dataset` on this machine: the cached choice, else tune and cache it."""
    result = tune_cached(dataset, budget=budget, config=config, cache_path=cache_path, runner=runner)
    if not result.from_cache:
        log.info("tune: measured\n%s", format_table(result))
    return result.settings


def format_table(result: TuneResult) -> str:
    """The measured runs as a text table, then the choice and its reason."""
    obj = result.objective
    head = (f"{'#':>3} {'phase':<8} {'workers':>7} {'prefetch':>8} {'threads':>7} {'pin':>3} "
            f"{'images/s':>9} {'tokens/s':>10} {'noise':>6} {'mem MiB':>8} {'max w MiB':>9} {'cons':>5} "
            f"{'run s':>6}  note")
    lines = [head, "-" * len(head)]
    for i, m in enumerate(result.measurements, 1):
        s = m.settings
        pf = "-" if s.prefetch_factor is None else str(s.prefetch_factor)
        if m.error is not None:
            lines.append(f"{i:>3} {m.phase:<8} {s.num_workers:>7} {pf:>8} {s.decode_threads:>7} "
                         f"{int(s.pin_memory):>3} {'':>9} {'':>10} {'':>6} {'':>8} {'':>9} {'':>5} "
                         f"{m.wall_s:>6.1f}  {m.error}")
            continue
        note = "; ".join(x for x in (m.note, "stopped early (clearly slower)" if m.stopped_early else "") if x)
        mark = " <" if s == result.settings and m is _last_run(result.measurements, s) else ""
        lines.append(f"{i:>3} {m.phase:<8} {s.num_workers:>7} {pf:>8} {s.decode_threads:>7} {int(s.pin_memory):>3} "
                     f"{m.images_per_s:>9.1f} {m.tokens_per_s:>10.0f} {m.rel_noise(obj):>6.1%} "
                     f"{m.memory_bytes / 2**20:>8.0f} {max(m.worker_pss, default=0) / 2**20:>9.0f} "
                     f"{m.consumer_cores:>5.2f} {m.wall_s:>6.1f}  {note}{mark}")
    lines.append("")
    src = " (from cache)" if result.from_cache else ""
    lines.append(f"choice{src}: {result.settings.label()}  [objective {obj}/s, {result.cpu_count} CPUs, "
                 f"memory budget {result.memory_budget / 2**20:.0f} MiB, search {result.elapsed_s:.1f}s]")
    lines.append(f"reason: {result.reason}")
    lines.append(f"(noise: relative standard error of a run's rate over 5 time slices; cons: CPUs the consumer "
                 f"load got, of {result.consumer_cores:g} asked)")
    return "\n".join(lines)


def _last_run(measurements: list[Measurement], settings: LoaderSettings) -> Measurement | None:
    runs = [m for m in measurements if m.settings == settings and m.error is None]
    return runs[-1] if runs else None
