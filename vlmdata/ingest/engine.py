"""Sharding engines: run `run_job` over a stream of job specs with bounded jobs in flight.

"local" uses a process pool (spawn context: safe with fsspec/s3fs threads in
the parent), "ray" runs the very same function as Ray tasks, and workers=0
runs jobs inline (debugging, tiny inputs). Results are handed to `on_done`
in completion order; the caller orders them by job number.

Live progress (local engine, when `on_progress` is given): each job reports
`(job, rows_done, written_done)` at most every `interval` seconds. Pool
workers put these small tuples on one multiprocessing queue handed to them
at start (pool initializer); the main thread drains it while it waits for
jobs, so callbacks always run on the caller's thread. Reports are
cumulative per job, so a late or lost report is harmless (the job's result
is the final word). Ray and caller-owned pools report per finished job only.
"""
from __future__ import annotations

import multiprocessing
import queue as queue_mod
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, ProcessPoolExecutor, wait

from vlmdata.ingest.job import JobOptions, JobSpec, run_job
from vlmdata.sysinfo import die_with_parent

ENGINES = ("local", "ray")
POLL_SECONDS = 0.1
ProgressFn = Callable[[int, int, int], None]   # (job, rows_done, written_done), cumulative within the job


class _Throttled:
    """A job's progress reporter: forwards at most one report per `interval` seconds."""

    def __init__(self, job: int, send: Callable[[tuple[int, int, int]], None], interval: float):
        self.job = job
        self.send = send
        self.interval = interval
        self.last = time.monotonic()

    def __call__(self, rows: int, written: int) -> None:
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self.send((self.job, rows, written))


class _WorkerChannel:
    """Per pool worker process: the progress queue and interval, set once by the pool initializer."""

    queue = None
    interval = 0.2


def _init_worker(progress_queue, interval: float) -> None:
    die_with_parent()
    _WorkerChannel.queue = progress_queue
    _WorkerChannel.interval = interval


def _run_job_reporting(spec: JobSpec, opts: JobOptions) -> dict:
    q = _WorkerChannel.queue
    report = None if q is None else _Throttled(spec.job, q.put, _WorkerChannel.interval)
    return run_job(spec, opts, report)


def run_local(specs: Iterator[JobSpec], opts: JobOptions, workers: int, on_done: Callable[[dict], None],
              executor: Executor | None = None, on_progress: ProgressFn | None = None,
              interval: float = 0.2) -> None:
    """Process pool; at most 2 * workers jobs submitted at a time (bounds memory).

    `executor` lets a caller reuse a pool it owns (e.g. across several runs);
    live progress then falls back to one report per finished job.
    """
    if workers <= 0 and executor is None:
        for spec in specs:
            report = None
            if on_progress is not None:
                report = _Throttled(spec.job, lambda msg: on_progress(*msg), interval)
            on_done(run_job(spec, opts, report))
        return
    if executor is not None:
        _feed(executor, specs, opts, max(1, workers), on_done)
        return
    ctx = multiprocessing.get_context("spawn")
    progress_queue = ctx.Queue() if on_progress is not None else None
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                 initargs=(progress_queue, interval)) as pool:
            drain = None if progress_queue is None else lambda: _drain(progress_queue, on_progress)
            _feed(pool, specs, opts, max(1, workers), on_done, drain)
    finally:
        if progress_queue is not None:
            progress_queue.close()
            progress_queue.join_thread()


def _drain(progress_queue, on_progress: ProgressFn) -> None:
    while True:
        try:
            msg = progress_queue.get_nowait()
        except queue_mod.Empty:
            return
        on_progress(*msg)


def _feed(pool: Executor, specs: Iterator[JobSpec], opts: JobOptions, workers: int,
          on_done: Callable[[dict], None], drain: Callable[[], None] | None = None) -> None:
    pending: set = set()
    timeout = None if drain is None else POLL_SECONDS

    def settle(limit: int) -> None:
        nonlocal pending
        while len(pending) > limit:
            done, pending = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
            if drain is not None:
                drain()
            for fut in done:
                on_done(fut.result())

    for spec in specs:
        pending.add(pool.submit(_run_job_reporting, spec, opts))
        settle(2 * workers - 1)
    settle(0)


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
             on_done: Callable[[dict], None], executor: Executor | None = None,
             on_progress: ProgressFn | None = None, interval: float = 0.2) -> None:
    if engine == "ray":
        run_ray(specs, opts, workers, on_done)
    else:
        run_local(specs, opts, workers, on_done, executor, on_progress, interval)
