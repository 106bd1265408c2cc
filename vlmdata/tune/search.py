"""The adaptive search over loader settings, generic over a `PipelineRunner`.

Order of the search (each step measures real runs through the runner):

1. workers: a ladder that scales with the CPU count (every count up to 4
   workers; beyond that 1, 2, 4, 8, ... up to the CPU count), stopping once a
   step gains less than `min_gain`, a candidate goes over the memory budget,
   or one fails;
2. refine: bisect between the best worker count and its measured neighbours
   until they are adjacent (unimodal throughput curve assumed; a plateau is
   handled by centring on the cheapest candidate within `plateau_tol`);
3. prefetch depth, then decode threads (up to CPUs / workers) at that worker
   count, each grown geometrically while it gains more than `min_gain`;
4. confirm: runs so far were short screening runs (`screen_fraction` of the
   measurement time); the leading candidates within noise of each other are
   measured again for the full time, interleaved, and their runs pooled;
5. choose: the cheapest eligible candidate whose rate is within
   `plateau_tol` (or the measured noise, if larger) of the best. "Cheapest"
   orders by total threads, then workers, then prefetch. 0 workers (loading
   in the training process, which serialises data with compute) is chosen
   only when clearly faster (by min_gain and twice the noise) than that pick.
   More workers than CPUs are considered only when one of them measured
   clearly faster (by min_gain and twice the noise) than the best setting
   within the CPU count: every run has the consumer load running
   (`TuneConfig.consumer_cores`), so such a gain is one training would see.

`confidence()` says how sure the choice is: the pick's measured noise, and how
far the best other worker count is from it in units of their combined noise.

Candidates are never chosen when their measured memory exceeds the budget;
counts predicted (from per-worker memory measured so far) to exceed it by
more than 15 % are not run at all.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from vlmdata.errors import OutOfTime
from vlmdata.tune.measure import MeasurePlan, PipelineRunner
from vlmdata.tune.results import Candidate, Measurement
from vlmdata.tune.settings import LoaderSettings, TuneConfig

PREDICT_SLACK = 1.15


@dataclass(frozen=True)
class SearchSpace:
    """The candidate settings for a machine with `cpu_count` CPUs."""

    cpu_count: int
    max_workers: int
    include_zero: bool
    prefetch: tuple[int, ...]
    pin: tuple[bool, ...]
    threads: bool = True

    def worker_ladder(self) -> list[int]:
        """Worker counts tried in the growth phase (the refine phase fills the gaps)."""
        lo = [0] if self.include_zero else []
        if self.max_workers <= 4:
            return lo + list(range(1, self.max_workers + 1))
        ladder, w = [], 1
        while w < self.max_workers:
            ladder.append(w)
            w *= 2
        return lo + ladder + [self.max_workers]

    def worker_counts(self) -> list[int]:
        return ([0] if self.include_zero else []) + list(range(1, self.max_workers + 1))

    def threads_for(self, workers: int) -> list[int]:
        """Decode threads per worker: 1, 2, 4, ... up to the CPUs each worker has."""
        top = max(1, self.cpu_count // max(1, workers)) if self.threads else 1
        out, t = [], 1
        while t <= top:
            out.append(t)
            t *= 2
        return out

    def all_settings(self) -> list[LoaderSettings]:
        """Every point of the space (what an exhaustive sweep measures)."""
        out = []
        for w in self.worker_counts():
            for pf in (self.prefetch if w else (None,)):
                for t in self.threads_for(w):
                    for pin in self.pin:
                        out.append(LoaderSettings(w, pf, t, pin))
        return out


def make_space(cpu_count: int, cfg: TuneConfig, pin_available: bool, threads: bool = True) -> SearchSpace:
    """The space for `cpu_count` CPUs: small machines also try 0 workers and one worker past the CPUs.

    threads=False: the pipeline has no decode-thread setting, so only 1 thread is tried.
    """
    cpu_count = max(1, cpu_count)
    max_workers = cpu_count + 1 if cpu_count <= 8 else cpu_count
    prefetch, p = [], 2
    while p <= max(2, cfg.max_prefetch):
        prefetch.append(p)
        p *= 2
    tune_pin = pin_available if cfg.tune_pin_memory is None else cfg.tune_pin_memory
    return SearchSpace(cpu_count=cpu_count, max_workers=max_workers, include_zero=cpu_count <= 4,
                       prefetch=tuple(prefetch), pin=(False, True) if tune_pin else (pin_available,),
                       threads=threads)


class AdaptiveSearch:
    """Runs the search; `measurements` keeps every run in order (the printed table)."""

    def __init__(self, runner: PipelineRunner, space: SearchSpace, cfg: TuneConfig,
                 memory_budget: int, time_budget_s: float, clock: Callable[[], float] = time.perf_counter):
        self.runner = runner
        self.space = space
        self.cfg = cfg
        self.memory_budget = memory_budget
        self.time_budget_s = time_budget_s
        self.clock = clock
        self.objective = cfg.objective or "tokens"
        self.candidates: dict[LoaderSettings, Candidate] = {}
        self.measurements: list[Measurement] = []
        self.notes: list[str] = []
        self._t0 = clock()

    # -- measuring -------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.clock() - self._t0

    def eligible(self, c: Candidate) -> bool:
        return not c.failed and c.memory_bytes() <= self.memory_budget

    def best_rate(self) -> float:
        return max((c.rate(self.objective) for c in self.candidates.values() if self.eligible(c)), default=0.0)

    def predict_memory(self, workers: int) -> float | None:
        """Memory expected at `workers` workers, extrapolated linearly from the runs so far.

        Uses the line through the two largest measured worker counts (a fixed
        part plus a per-worker part). With one point, each further worker adds
        its private memory (USS): pages it shares with the consumer are already
        counted once in the PSS sum, so scaling the whole PSS would count them
        again per worker. None before any worker ran.
        """
        points: dict[int, int] = {}
        private: dict[int, int] = {}
        for c in self.candidates.values():
            w = c.settings.num_workers
            if w > 0 and not c.failed:
                points[w] = max(points.get(w, 0), c.memory_bytes())
                private[w] = max(private.get(w, 0), c.worker_private_bytes())
        if not points:
            return None
        ws = sorted(points)
        if len(ws) == 1:
            w = ws[0]
            per_worker = private[w] or points[w] / w
            return points[w] + per_worker * (workers - w)
        w1, w2 = ws[-2], ws[-1]
        slope = max(0.0, (points[w2] - points[w1]) / (w2 - w1))
        return points[w2] + slope * (workers - w2)

    def measure(self, settings: LoaderSettings, phase: str, early: bool = True) -> Candidate:
        """Measure `settings` once (unless predicted over budget) and return its candidate."""
        if self.measurements and self.elapsed() > self.time_budget_s:
            raise OutOfTime
        cand = self.candidates.setdefault(settings, Candidate(settings))
        predicted = self.predict_memory(settings.num_workers) if settings.num_workers else None
        if predicted is not None and predicted > self.memory_budget * PREDICT_SLACK:
            m = Measurement(settings=settings, phase=phase,
                            error=f"not run: predicted {_mib(predicted)} MiB > budget {_mib(self.memory_budget)} MiB")
            cand.runs.append(m)
            self.measurements.append(m)
            return cand
        stop_below = self.stop_below() if early else None
        full = phase == "confirm"
        plan = MeasurePlan(objective=self.objective, warmup_batches=self.cfg.warmup_batches,
                           measure_s=self.cfg.measure_s * (1.0 if full else self.cfg.screen_fraction),
                           min_batches=self.cfg.min_batches,
                           max_batches=self.cfg.max_batches, stop_below=stop_below,
                           consumer_cores=self.cfg.consumer_cores)
        m = self.runner.measure(settings, plan)
        m.phase = phase
        if m.error is None and m.memory_bytes > self.memory_budget:
            m.note = (m.note + "; " if m.note else "") + "over memory budget"
        if self.cfg.objective is None and not self.measurements and m.error is None:
            self.objective = "tokens" if m.tokens else "images" if m.images else "batches"
        cand.runs.append(m)
        self.measurements.append(m)
        return cand

    def stop_below(self) -> float | None:
        """Rate under which a run may stop early: early_stop below the best, widened by its noise."""
        pool = [c for c in self.candidates.values() if self.eligible(c)]
        if not pool:
            return None
        best = max(pool, key=lambda c: c.rate(self.objective))
        margin = max(self.cfg.early_stop, 3 * best.rel_noise(self.objective))
        return best.rate(self.objective) * (1 - margin) if margin < 1 else None

    # -- choosing --------------------------------------------------------------------------------
    def tolerance(self, best: Candidate) -> float:
        return max(self.cfg.plateau_tol, min(2 * best.rel_noise(self.objective), self.cfg.min_gain))

    def choose(self, pool: list[Candidate] | None = None) -> Candidate | None:
        """The cheapest eligible candidate within tolerance of the best rate."""
        pool = [c for c in (pool if pool is not None else self.candidates.values()) if self.eligible(c)]
        with_workers = self._within_cpus([c for c in pool if c.settings.num_workers > 0])
        if not with_workers:
            return min(pool, key=lambda c: -c.rate(self.objective)) if pool else None
        best = max(with_workers, key=lambda c: c.rate(self.objective))
        floor = best.rate(self.objective) * (1 - self.tolerance(best))
        near = [c for c in with_workers if c.rate(self.objective) >= floor]
        pick = min(near, key=lambda c: cost_key(c.settings))
        # 0 workers loads inside the training loop (serialising data with compute): only when clearly faster
        inline = [c for c in pool if c.settings.num_workers == 0 and self.clearly_better(c, pick)]
        return inline[0] if inline else pick

    def _within_cpus(self, cands: list[Candidate]) -> list[Candidate]:
        """`cands` without those over the CPU count, unless one of those is clearly faster than all within."""
        cpus = self.space.cpu_count
        within = [c for c in cands if c.settings.num_workers <= cpus]
        over = [c for c in cands if c.settings.num_workers > cpus]
        if not within or not over:
            return cands
        best_within = max(within, key=lambda c: c.rate(self.objective))
        if any(self.clearly_better(c, best_within) for c in over):
            return cands
        return within

    def confidence(self, chosen: Candidate | None) -> str:
        """How sure the choice is, in one line: the pick's noise and its distance to the nearest rival."""
        if chosen is None:
            return "no choice"
        obj = self.objective
        r = chosen.rate(obj)
        noise = chosen.rel_noise(obj)
        runs = len(chosen.ok_runs())
        others = [c for c in self.candidates.values() if self.eligible(c)
                  and c.settings.num_workers != chosen.settings.num_workers]
        head = f"{chosen.settings.label()}: {r:.1f} {obj}/s +- {noise:.1%} ({runs} run{'s' * (runs != 1)})"
        if not others or r <= 0:
            return head + "; no other worker count measured"
        rival = max(others, key=lambda c: c.rate(obj))
        diff = rival.rate(obj) / r - 1
        sigma = math.hypot(noise, rival.rel_noise(obj)) or 1e-9
        k = abs(diff) / sigma
        if diff > 0:
            verdict = (f"within noise ({k:.1f} sigma): the cheaper setting was taken" if k < 2 or diff < self.cfg.min_gain
                       else f"faster by {k:.1f} sigma but not chosen (memory, CPU count or cost rule)")
        else:
            verdict = "clearly better" if k >= 2 and -diff >= self.cfg.min_gain else f"ahead by {k:.1f} sigma only"
        return f"{head}; best other worker count {rival.settings.label()} at {diff:+.1%}: {verdict}"

    # -- phases ----------------------------------------------------------------------------------
    def base(self, workers: int) -> LoaderSettings:
        return LoaderSettings(workers, 2 if workers else None, 1, self.space.pin[0])

    def grow_workers(self) -> None:
        best: Candidate | None = None
        extended = False
        for w in self.space.worker_ladder():
            if w > self.space.cpu_count and self._flat_at_cpus():
                self.notes.append(f"{w} workers not tried: {self.space.cpu_count} gained nothing over fewer "
                                  "(more workers than CPUs could only add contention)")
                return
            c = self.measure(self.base(w), "workers", early=False)
            if c.failed:
                self.notes.append(f"{w} workers {c.runs[-1].error}: stopped growing")
                return
            if not self.eligible(c):
                self.notes.append(f"{w} workers over the memory budget: stopped growing")
                return
            r = c.rate(self.objective)
            linear = self.space.max_workers <= 4
            if w >= 2 and not linear and best is not None and r < best.rate(self.objective) * (1 + self.cfg.min_gain):
                noisy = 2 * max(c.rel_noise(self.objective), best.rel_noise(self.objective)) > self.cfg.min_gain
                if not (noisy and not extended):
                    self.notes.append(f"gain flattened at {w} workers (< {self.cfg.min_gain:.0%})")
                    return
                extended = True          # inconclusive (noisy): one more step before giving up
            if w >= 1 and (best is None or r > best.rate(self.objective)):
                best = c

    def _flat_at_cpus(self) -> bool:
        """True when `cpu_count` workers measured no faster than fewer (within min_gain, with little noise):
        more workers than CPUs could then only add contention."""
        top = self.candidates.get(self.base(self.space.cpu_count))
        fewer = [c for s, c in self.candidates.items()
                 if s == self.base(s.num_workers) and 1 <= s.num_workers < self.space.cpu_count and not c.failed]
        if top is None or top.failed or not fewer:
            return False
        best = max(fewer, key=lambda c: c.rate(self.objective))
        obj = self.objective
        return (top.rate(obj) <= best.rate(obj) * (1 + self.cfg.min_gain)
                and top.rel_noise(obj) < self.cfg.min_gain / 2 and best.rel_noise(obj) < self.cfg.min_gain / 2)

    def refine_workers(self) -> None:
        while True:
            pool = [c for s, c in self.candidates.items() if s == self.base(s.num_workers)]
            center = self.choose(pool)
            if center is None:
                return
            cw = center.settings.num_workers
            measured = sorted(c.settings.num_workers for c in pool)
            below = [w for w in measured if w < cw]
            above = [w for w in measured if w > cw]
            probes = []
            if below and cw - below[-1] > 1:
                probes.append((below[-1] + cw) // 2)
            if above and above[0] - cw > 1:
                probes.append((cw + above[0]) // 2)
            if not probes:
                return
            for w in probes:
                self.measure(self.base(w), "refine")

    def grow_option(self, make: Callable[[LoaderSettings, int], LoaderSettings], values: list[int],
                    phase: str) -> None:
        """Try `values` in order at the current choice; keep going while each gains > min_gain."""
        current = self.choose()
        if current is None:
            return
        for v in values:
            s = make(current.settings, v)
            if s == current.settings or s in self.candidates:
                continue
            c = self.measure(s, phase)
            if not self.eligible(c) or not self.clearly_better(c, current):
                return
            current = c

    def clearly_better(self, a: Candidate, b: Candidate) -> bool:
        """`a` beats `b` by more than min_gain and by more than twice their combined noise."""
        noise = math.hypot(a.rel_noise(self.objective), b.rel_noise(self.objective))
        return a.rate(self.objective) > b.rate(self.objective) * (1 + max(self.cfg.min_gain, 2 * noise))

    def confirm(self) -> None:
        pool = [c for c in self.candidates.values() if self.eligible(c)]
        if len(pool) < 2:
            return
        pool.sort(key=lambda c: c.rate(self.objective), reverse=True)
        top = pool[0]
        margin = max(self.cfg.min_gain, 3 * top.rel_noise(self.objective))
        close = [c for c in pool[: self.cfg.confirm_top]
                 if c.rate(self.objective) >= top.rate(self.objective) * (1 - margin)]
        chosen = self.choose()
        if chosen is not None and chosen not in close:
            close.append(chosen)
        if len(close) < 2:
            return
        for c in close:
            self.measure(c.settings, "confirm", early=False)

    def run(self) -> Candidate | None:
        """All phases; returns the chosen candidate (None when nothing fits the budget)."""
        try:
            self.grow_workers()
            self.refine_workers()
            chosen = self.choose()
            if chosen is not None and chosen.settings.num_workers > 0:
                self.grow_option(lambda s, v: LoaderSettings(s.num_workers, v, s.decode_threads, s.pin_memory),
                                 [p for p in self.space.prefetch if p > 2], "prefetch")
            chosen = self.choose()
            if chosen is not None:
                threads = self.space.threads_for(max(1, chosen.settings.num_workers))
                self.grow_option(lambda s, v: LoaderSettings(s.num_workers, s.prefetch_factor, v, s.pin_memory),
                                 [t for t in threads if t > 1], "threads")
            if len(self.space.pin) > 1:
                self.grow_option(lambda s, v: LoaderSettings(s.num_workers, s.prefetch_factor,
                                                             s.decode_threads, bool(v)), [1], "pin")
            self.confirm()
        except OutOfTime:
            self.notes.append(f"time budget {self.time_budget_s:.0f}s reached: chose from what was measured")
        return self.choose()

    def reason(self, chosen: Candidate | None) -> str:
        """Why `chosen` won, in one paragraph."""
        if chosen is None:
            return ("no candidate fits: every measured setting exceeded the memory budget "
                    f"({_mib(self.memory_budget)} MiB) or failed")
        obj = self.objective
        pool = [c for c in self.candidates.values() if self.eligible(c)]
        best = max([c for c in pool if c.settings.num_workers > 0] or pool, key=lambda c: c.rate(obj))
        parts = [f"{chosen.settings.label()} delivers {chosen.rate(obj):.1f} {obj}/s"]
        if best is chosen:
            parts.append("the highest rate measured" + (" with workers" if chosen.settings.num_workers else ""))
        elif chosen.settings.num_workers == 0:
            parts.append(f"clearly faster than any setting with workers (best {best.rate(obj):.1f} at "
                         f"{best.settings.label()})")
        else:
            parts.append(f"within {self.tolerance(best):.1%} of the best ({best.rate(obj):.1f} at "
                         f"{best.settings.label()}) and cheaper")
        over = [c for c in pool if c.settings.num_workers > self.space.cpu_count]
        if over and chosen.settings.num_workers <= self.space.cpu_count:
            parts.append(f"more workers than the {self.space.cpu_count} CPUs not chosen: not clearly faster with "
                         f"the consumer load ({self.cfg.consumer_cores:g} CPU) running")
        inline = [c for c in pool if c.settings.num_workers == 0 and c is not chosen]
        if inline and inline[0].rate(obj) > chosen.rate(obj):
            parts.append(f"0 workers measured {inline[0].rate(obj):.1f} but not clearly faster (> "
                         f"{self.cfg.min_gain:.0%} and 2x noise), so loading stays out of the training process")
        over = sum(1 for c in self.candidates.values() if not c.failed and not self.eligible(c))
        predicted = sum(1 for c in self.candidates.values()
                        if c.failed and any((m.error or "").startswith("not run") for m in c.runs))
        failed = sum(1 for c in self.candidates.values() if c.failed) - predicted
        if over:
            parts.append(f"{over} setting(s) measured over the {_mib(self.memory_budget)} MiB memory budget")
        if predicted:
            parts.append(f"{predicted} not run (predicted over the memory budget)")
        if failed:
            parts.append(f"{failed} failed")
        parts.append(f"{len(self.measurements)} runs on {self.space.cpu_count} CPUs with a consumer load of "
                     f"{self.cfg.consumer_cores:g} CPU")
        return "; ".join(parts + self.notes)


def cost_key(s: LoaderSettings) -> tuple:
    """Cheaper settings sort first: fewer total threads, fewer workers, shallower prefetch, no pinning."""
    return (s.num_workers == 0, max(1, s.num_workers) * s.decode_threads, s.num_workers,
            s.prefetch_factor or 0, s.pin_memory)


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f}" if math.isfinite(n) else "inf"
