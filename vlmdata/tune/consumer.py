"""A stand-in for the training step's CPU use while the tuner measures a loader setting.

The training process needs CPU too (the Python side of each step, kernel launches, the
host-to-device copies, a GPU decode stage's feeding), so a loader setting measured on an idle
machine over-counts the CPU its workers will get: on a 2-CPU machine 3 workers look best when
nothing else runs, and starve the step in training. `ConsumerLoad(cores)` keeps `cores` CPUs'
worth busy in the measuring process for the duration of a measurement: each thread hashes a
buffer for its share of every 20 ms period and sleeps the rest. The share is one hashlib call
(sized from a one-off calibration), which runs without the GIL: a thread that went back for the
GIL every 100 us would get almost none of its share while the main thread runs Python (a
loader with 0 workers), since each hand-over waits out the interpreter's 5 ms switch interval.
`cores=0` measures the loader alone.
"""
from __future__ import annotations

import hashlib
import math
import threading
import time

__all__ = ["ConsumerLoad"]

PERIOD_S = 0.02
_CALIBRATION_BYTES = 1 << 22
_hash_rate: float | None = None        # bytes hashed per CPU second on this machine


def hash_rate() -> float:
    """SHA-1 bytes per second of one core, measured once per process (best of three)."""
    global _hash_rate
    if _hash_rate is None:
        block, best = bytes(_CALIBRATION_BYTES), float("inf")
        for _ in range(3):
            t0 = time.thread_time()
            hashlib.sha1(block).digest()
            best = min(best, time.thread_time() - t0)
        _hash_rate = _CALIBRATION_BYTES / max(best, 1e-6)
    return _hash_rate


class ConsumerLoad:
    """Context manager: `cores` CPUs' worth of busy threads (fractional cores: a duty cycle)."""

    def __init__(self, cores: float = 1.0):
        if cores < 0:
            raise ValueError(f"consumer cores must be >= 0, got {cores}")
        self.cores = float(cores)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._cpu: list[float] = []
        self._t0 = 0.0
        self.elapsed_s = 0.0

    def _spin(self, duty: float, slot: int) -> None:
        share = memoryview(bytes(max(1, int(duty * PERIOD_S * hash_rate()))))
        t0 = time.thread_time()
        while not self._stop.is_set():
            start = time.perf_counter()
            hashlib.sha1(share).digest()                # one GIL-free call: this period's share
            rest = start + PERIOD_S - time.perf_counter()
            if rest > 0:
                self._stop.wait(rest)
        self._cpu[slot] = time.thread_time() - t0

    def __enter__(self) -> ConsumerLoad:
        n = math.ceil(self.cores)
        self._cpu = [0.0] * n
        self._t0 = time.perf_counter()
        for i in range(n):
            duty = min(1.0, self.cores - i)
            t = threading.Thread(target=self._spin, args=(duty, i), name=f"vlmdata-consumer-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
        self.elapsed_s = time.perf_counter() - self._t0

    @property
    def achieved_cores(self) -> float:
        """CPU seconds the load really got per second (less than `cores` on a busy machine)."""
        return sum(self._cpu) / self.elapsed_s if self.elapsed_s > 0 else 0.0
