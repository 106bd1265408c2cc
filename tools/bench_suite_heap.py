#!/usr/bin/env python
"""Time tests on a late suite's heap, with and without the `frozen_heap` fixture, in one run.

Late in `make test` the pytest process holds millions of long-lived objects; every `gc.collect()` walks them
and a forked DataLoader worker's collections copy their pages. The tuner's tests collect before each
measurement, so they took 3-4x longer in the suite than alone. This runs the given tests in fresh pytest
processes with `--objects` kept alive (tools/suite_heap_plugin.py), alternating "before" (gc.freeze made a
no-op: the fixture does nothing) and "after" (the fixture as committed), `--rounds` times, and prints each
test's median call time and each mode's median wall and CPU seconds (children included).

    .venv/bin/python tools/bench_suite_heap.py [--objects 3000000] [--rounds 2] tests/tune/test_tuner_pipeline.py
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CALL = re.compile(r"^([0-9.]+)s call\s+(\S+)", re.M)


def run_once(targets: list[str], objects: int, freeze: bool) -> tuple[float, float, dict[str, float], str]:
    """(wall s, CPU s, test -> call s, pytest's summary line) of one pytest process."""
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tools'}",
               VLMDATA_BENCH_HEAP_OBJECTS=str(objects), VLMDATA_BENCH_HEAP_NO_FREEZE="0" if freeze else "1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "suite_heap_plugin", "-p", "no:cacheprovider",
                           "--durations=0", "--durations-min=0.5", *targets],
                          cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else f"exit {proc.returncode}"
    return wall, cpu, {name: float(s) for s, name in CALL.findall(proc.stdout)}, summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="+", help="pytest files or node ids")
    ap.add_argument("--objects", type=int, default=3_000_000, help="long-lived objects held (default 3,000,000)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    runs: dict[str, list] = {"before": [], "after": []}
    for r in range(args.rounds):
        for mode in runs:
            wall, cpu, calls, summary = run_once(args.targets, args.objects, freeze=mode == "after")
            runs[mode].append((wall, cpu, calls))
            print(f"round {r + 1} {mode}: {wall:.1f} s wall, {cpu:.1f} s CPU; {summary}; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    tests = sorted({t for mode in runs.values() for _, _, calls in mode for t in calls})
    med = lambda mode, t: statistics.median(c.get(t, 0.0) for _, _, c in runs[mode])  # noqa: E731
    print(f"\n{args.objects:,} long-lived objects, {args.rounds} rounds, medians\n")
    print("| test | before s | after s |\n|---|---|---|")
    for t in sorted(tests, key=lambda t: -med("before", t)):
        print(f"| {t} | {med('before', t):.1f} | {med('after', t):.1f} |")
    for i, what in ((0, "wall"), (1, "CPU")):
        b, a = (statistics.median(run[i] for run in runs[m]) for m in ("before", "after"))
        print(f"| whole run, {what} | {b:.1f} | {a:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
