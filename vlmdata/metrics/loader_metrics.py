"""Measuring a training loop's data wait: wrap the loader, and each batch's counts reach the metrics.

    for batch in instrument(loader, metrics, rank=0):
        train_step(batch)

`instrument` (or `LoaderMetrics`) absorbs each batch's `stats` (the counts the
DataLoader workers attached, see `vlmdata.metrics.counts.StatsDelta`) and
measures, per rank:

- data-wait seconds: time blocked inside `next()` on the loader;
- step seconds: from asking for batch i to asking for batch i+1, i.e. the
  data wait of step i plus the work done on batch i. So the data-wait
  fraction of a rank is rate(data_wait_seconds) / rate(step_seconds), in [0, 1].
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from vlmdata.metrics.counts import StatsDelta
from vlmdata.metrics.registry import MetricSet

__all__ = ["LoaderMetrics", "instrument"]


class LoaderMetrics:
    """Wraps any iterable of batches: absorbs `batch["stats"]`, times data wait and steps.

    Iterate it like the loader. Works with any training loop: the time between two
    `next()` calls is the step. `clock` is injectable for tests.
    """

    def __init__(self, loader: Iterable, metrics: MetricSet, rank: int | str = 0,
                 clock: Callable[[], float] = time.perf_counter):
        self.loader = loader
        self.metrics = metrics
        self.rank = str(rank)
        self.clock = clock

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator:
        it: Iterator | None = None
        step_start: float | None = None
        wait = 0.0
        try:
            while True:
                asked = self.clock()
                if step_start is not None:
                    self._close_step(asked - step_start, wait)
                step_start = asked
                try:
                    if it is None:  # starting the loader (spawning workers) is data wait too
                        it = iter(self.loader)
                    batch = next(it)
                except StopIteration:
                    step_start = None  # nothing delivered: neither a step nor a wait to count
                    return
                wait = self.clock() - asked
                self._absorb(batch)
                yield batch
        finally:
            if step_start is not None:  # the consumer stopped early: its last step ends now
                self._close_step(self.clock() - step_start, wait)

    def _close_step(self, step: float, wait: float) -> None:
        """Count a finished step, then its data wait: a scrape never sees a wait without its step, so
        rate(wait) / rate(step) stays within [0, 1]."""
        self.metrics.observe_step(step, self.rank)
        self.metrics.observe_wait(wait, self.rank)

    def _absorb(self, batch) -> None:
        stats = batch.get("stats") if isinstance(batch, dict) else None
        if stats is None:
            return
        self.metrics.absorb(stats if isinstance(stats, StatsDelta) else StatsDelta.from_dict(stats), self.rank)


def instrument(loader: Iterable, metrics: MetricSet, rank: int | str = 0) -> LoaderMetrics:
    """`for batch in instrument(loader, metrics, rank): ...` (see LoaderMetrics)."""
    return LoaderMetrics(loader, metrics, rank)
