"""Sharding engines: run `run_job` over a stream of job specs with bounded jobs in flight.

"local" uses a process pool (spawn context: safe with fsspec/s3fs threads in
the parent), "ray" runs the very same function as Ray tasks, and workers=0
runs jobs inline (debugging, tiny inputs). Results are handed to `on_done`
in completion order; the caller orders them by job number.
"""
from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, ProcessPoolExecutor, as_completed, wait

from vlmdata.ingest.job import JobOptions, JobSpec, run_job

ENGINES = ("local", "ray")


def run_local(specs: Iterator[JobSpec], opts: JobOptions, workers: int, on_done: Callable[[dict], None],
              executor: Executor | None = None) -> None:
    """Process pool; at most 2 * workers jobs submitted at a time (bounds memory).

    `executor` lets a caller reuse a pool it owns (e.g. across several runs).
    """
    if workers <= 0 and executor is None:
        for spec in specs:
            on_done(run_job(spec, opts))
        return
    if executor is None:
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            _feed(pool, specs, opts, max(1, workers), on_done)
    else:
        _feed(executor, specs, opts, max(1, workers), on_done)


def _feed(pool: Executor, specs: Iterator[JobSpec], opts: JobOptions, workers: int,
          on_done: Callable[[dict], None]) -> None:
    pending = set()
    for spec in specs:
        pending.add(pool.submit(run_job, spec, opts))
        if len(pending) >= 2 * workers:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                on_done(fut.result())
    for fut in as_completed(pending):
        on_done(fut.result())


def run_ray(specs: Iterator[JobSpec], opts: JobOptions, workers: int, on_done: Callable[[dict], None]) -> None:
    """Ray tasks (connects to RAY_ADDRESS or starts a local instance if none is running)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=workers or None, include_dashboard=False, log_to_driver=False)
    remote = ray.remote(run_job)
    opts_ref = ray.put(opts)
    limit = 2 * max(1, workers or int(ray.available_resources().get("CPU", 1)))
    pending: list = []
    for spec in specs:
        pending.append(remote.remote(spec, opts_ref))
        if len(pending) >= limit:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                on_done(ray.get(ref))
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            on_done(ray.get(ref))


def run_jobs(engine: str, specs: Iterator[JobSpec], opts: JobOptions, workers: int,
             on_done: Callable[[dict], None], executor: Executor | None = None) -> None:
    if engine == "ray":
        run_ray(specs, opts, workers, on_done)
    else:
        run_local(specs, opts, workers, on_done, executor)
