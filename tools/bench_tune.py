#!/usr/bin/env python
"""Benchmark the loader auto-tuner against an exhaustive sweep of the same space, in one run.

Real pipeline (default): a gen_raw corpus is sharded with `shard_dataset`, opened
as a `VLMDataset`, and every setting of the tuner's search space for this
machine is measured (the baseline); then the tuner runs. Every run, sweep and
tuner alike, has the consumer load running (`--consumer-cores`, default 1 CPU:
the training step's share, `vlmdata.tune.ConsumerLoad`) and loops the dataset
(no run ends because the data did). Reported: the tuner's pick versus the
sweep's best (throughput, from the sweep's own table and from an interleaved
re-measurement of both), and the tuner's time versus the sweep's. Targets:
pick within 5 % of the best, in at most 40 % of the time.

`--synthetic N` adds the same comparison on the synthetic pipeline with a
known optimum, searched as if the machine had N CPUs (its costs are sleeps,
so the 2-core box can stand in for a larger one).

    .venv/bin/python tools/bench_tune.py [--samples 600] [--synthetic 16] [--out bench_out/bench-tune.md]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass

import torch

from vlmdata.sysinfo import cpu_model
from vlmdata.testing import SyntheticDataset, SyntheticSpec, bench_corpus, write_report
from vlmdata.tune import (
    LoaderRunner,
    LoaderSettings,
    Measurement,
    MeasurePlan,
    TuneBudget,
    TuneConfig,
    format_table,
    make_space,
    total_memory,
    tune,
    usable_cpus,
)


@dataclass
class Comparison:
    name: str
    cpus: int
    objective: str
    sweep: list[Measurement]
    sweep_s: float
    tuned: object           # TuneResult
    tune_s: float
    verify: dict            # label -> mean rate from interleaved re-measurement
    passes: int = 1

    def sweep_rate(self, s: LoaderSettings) -> float | None:
        rates = [m.rate(self.objective) for m in self.sweep if m.settings == s and m.error is None]
        return sum(rates) / len(rates) if rates else None

    def best(self) -> Measurement:
        """The sweep's best setting (by its mean over the sweep's passes), as one of its measurements."""
        ok = [m for m in self.sweep if m.error is None]
        top = max({m.settings for m in ok}, key=lambda s: self.sweep_rate(s))
        return next(m for m in ok if m.settings == top)

    def best_rate(self) -> float:
        return self.sweep_rate(self.best().settings)

    def lines(self) -> list[str]:
        best = self.best()
        pick = self.tuned.settings
        pr = self.sweep_rate(pick)
        out = [f"### {self.name} ({self.cpus} CPUs, objective {self.objective}/s, consumer load "
               f"{self.tuned.consumer_cores:g} CPU in every run)", "",
               f"- exhaustive sweep: {len({m.settings for m in self.sweep})} settings, {self.passes} pass(es) in "
               f"rotated order, {self.sweep_s:.1f} s per pass; best {best.settings.label()} = "
               f"{self.best_rate():.1f}/s (mean of its passes)",
               f"- tuner: {len(self.tuned.measurements)} runs in {self.tune_s:.1f} s; pick {pick.label()}",
               f"- time ratio tuner/sweep: **{self.tune_s / self.sweep_s:.1%}** (target <= 40 %)"]
        if pr is not None:
            out.append(f"- pick's rate in the sweep table / sweep best: **{pr / self.best_rate():.1%}**"
                       " (target >= 95 %)")
        if len(self.verify) == 2:
            (la, a), (lb, b) = self.verify.items()
            out.append(f"- interleaved re-measurement, pick / sweep best: **{b / a:.1%}** "
                       f"({lb}: {b:.1f}/s vs {la}: {a:.1f}/s)")
        elif self.verify:
            out.append("- the tuner picked the sweep's best setting")
        out.append(f"- tuner's reason (with its confidence): {self.tuned.reason}")
        over = [m for m in self.sweep if m.settings.num_workers > self.cpus and m.error is None]
        if over:
            top = max(over, key=lambda m: m.rate(self.objective))
            out.append(f"- more workers than CPUs in the sweep: best {top.settings.label()} at "
                       f"{self.sweep_rate(top.settings) / self.best_rate():.1%} of the sweep's best")
        return out


def machine_lines() -> list[str]:
    import numpy
    import PIL
    return [f"- machine: {cpu_model()}, {os.cpu_count()} CPUs ({usable_cpus()} usable), "
            f"{total_memory() / 2**30:.0f} GiB RAM, load average {os.getloadavg()[0]:.1f}",
            f"- python {platform.python_version()}, torch {torch.__version__}, numpy {numpy.__version__}, "
            f"PIL {PIL.__version__}"]


def sweep(runner, settings: list[LoaderSettings], plan: MeasurePlan, passes: int) -> tuple[list[Measurement], float]:
    """Every setting, `passes` times in rotated order; returns the runs and the seconds of one pass."""
    t0 = time.perf_counter()
    out = []
    for p in range(passes):
        k = p * len(settings) // max(1, passes)
        for s in settings[k:] + settings[:k]:
            m = runner.measure(s, plan)
            m.phase = "sweep"
            out.append(m)
            rate = "failed" if m.error else f"{m.rate(plan.objective):9.1f}/s"
            print(f"  sweep {p + 1} {s.label():<26} {rate}  mem {m.memory_bytes / 2**20:6.0f} MiB  consumer "
                  f"{m.consumer_cores:.2f} CPU", flush=True)
    return out, (time.perf_counter() - t0) / passes


def verify(runner, a: LoaderSettings, b: LoaderSettings, plan: MeasurePlan, rounds: int) -> dict:
    """Mean rate of `a` and `b`, measured alternately `rounds` times each."""
    if a == b:
        return {a.label(): 0.0}
    rates: dict[str, list[float]] = {a.label(): [], b.label(): []}
    for _ in range(rounds):
        for s in (a, b):
            m = runner.measure(s, plan)
            if m.error is None:
                rates[s.label()].append(m.rate(plan.objective))
    return {k: sum(v) / max(1, len(v)) for k, v in rates.items()}


def compare(name: str, runner_factory, cfg: TuneConfig, budget: TuneBudget, rounds: int,
            passes: int = 1) -> Comparison:
    cpus = cfg.cpu_count or usable_cpus()
    space = make_space(cpus, cfg, pin_available=torch.cuda.is_available(),
                       threads=getattr(runner_factory(), "tunes_threads", True))
    settings = space.all_settings()
    print(f"\n== {name}: sweeping {len(settings)} settings on {cpus} CPUs", flush=True)
    warm = runner_factory()
    objective = cfg.objective or "tokens"
    plan = MeasurePlan(objective=objective, warmup_batches=cfg.warmup_batches, measure_s=cfg.measure_s,
                       min_batches=cfg.min_batches, consumer_cores=cfg.consumer_cores)
    warm.measure(LoaderSettings(min(2, space.max_workers), 2), plan)   # page cache, imports: not counted
    table, sweep_s = sweep(runner_factory(), settings, plan, passes)
    print(f"== {name}: tuning", flush=True)
    t0 = time.perf_counter()
    result = tune(runner=runner_factory(), budget=budget, config=cfg)
    tune_s = time.perf_counter() - t0
    print(format_table(result), flush=True)
    cmp = Comparison(name, cpus, result.objective, table, sweep_s, result, tune_s, {}, passes)
    cmp.verify = verify(runner_factory(), cmp.best().settings, result.settings, plan, rounds)
    return cmp


def build_real_dataset(args):
    from vlmdata.loading import VLMDataset

    root = args.data or bench_corpus(args.cache, args.samples, None).wds
    return VLMDataset(root, seed=0, max_tokens=args.max_tokens, image_size=args.image_size,
                      decoder=args.decoder, rank=0, world_size=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="an existing dataset directory (skips generation)")
    p.add_argument("--cache", default=os.environ.get("VLMDATA_BENCH_CACHE", "/tmp/vlmdata-bench"),
                   help="where the generated corpus is kept between runs")
    p.add_argument("--max-tokens", type=int, default=8192)
    p.add_argument("--image-size", type=int, default=336)
    p.add_argument("--decoder", default="auto")
    p.add_argument("--measure-s", type=float, default=2.0)
    p.add_argument("--consumer-cores", type=float, default=1.0,
                   help="CPUs kept busy in the measuring process during every run (the training step's share)")
    p.add_argument("--rounds", type=int, default=4, help="interleaved re-measurements of pick vs best")
    p.add_argument("--sweep-passes", type=int, default=2,
                   help="passes of the exhaustive sweep (rotated order), averaged: the baseline's own noise")
    p.add_argument("--no-real", action="store_true", help="skip the real pipeline")
    p.add_argument("--space-cpus", type=int, default=None,
                   help="search space of the real pipeline as for this many CPUs (default: this machine's)")
    p.add_argument("--synthetic", type=int, default=0, metavar="CPUS",
                   help="also compare on the synthetic pipeline searched for CPUS CPUs (e.g. 16)")
    p.add_argument("--out", default="bench_out/bench-tune.md")
    args = p.parse_args(argv)

    head = machine_lines()
    print("\n".join(head))
    results: list[Comparison] = []
    if not args.no_real:
        ds = build_real_dataset(args)
        cfg = TuneConfig(measure_s=args.measure_s, min_batches=4, cpu_count=args.space_cpus,
                         consumer_cores=args.consumer_cores)
        results.append(compare(f"real pipeline (VLMDataset, {args.decoder}, max_tokens {args.max_tokens}, "
                               f"image {args.image_size})", lambda: LoaderRunner(ds), cfg,
                               TuneBudget(time_s=600), args.rounds, args.sweep_passes))
    if args.synthetic:
        spec = SyntheticSpec(item_s=0.04, image_s=0.004, images_per_item=4,
                             knee=max(2, args.synthetic * 2 // 3), contention=2.0, payload_kb=1)
        cfg = TuneConfig(measure_s=0.4, min_batches=6, cpu_count=args.synthetic, consumer_cores=0)
        results.append(compare(f"synthetic pipeline (known optimum {spec.knee} workers)",
                               lambda: LoaderRunner(SyntheticDataset(spec)), cfg,
                               TuneBudget(memory_bytes=1 << 40, time_s=600), args.rounds))
    cmd = "python tools/bench_tune.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = ["# Loader auto-tuner benchmark", "", f"Command: `{cmd.strip()}`", ""] + head + [""]
    for r in results:
        md += r.lines() + [""]
    text = "\n".join(md)
    print("\n" + text)
    write_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
