"""A loading pipeline with a known optimum, to test and benchmark the tuner.

`SyntheticDataset` is a real `IterableDataset` run through a real DataLoader.
Each item ("pack") costs:

    (item_s + ceil(images_per_item / decode_threads) * image_s) * slowdown(n)  +  cpu_s (busy CPU)

where n is the DataLoader's worker count and slowdown(n) = max(1, n / knee) **
contention models a shared resource (storage bandwidth): with contention = 1
throughput grows linearly up to `knee` workers and is flat after it (the best
choice is `knee`, the cheapest on the plateau); with contention = 2 it peaks
at exactly `knee` and falls after it. Waiting is done by sleeping, so the
optimum does not depend on how busy the machine's CPUs are. Image work runs
on a pool of `decode_threads` threads (set through `set_decode_threads`).
Each worker holds `alloc_mb` MiB of touched memory, for memory-budget tests.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info


@dataclass(frozen=True)
class SyntheticSpec:
    """Costs of the synthetic pipeline (see module docstring)."""

    item_s: float = 0.02
    image_s: float = 0.0
    images_per_item: int = 4
    tokens_per_item: int = 1024
    knee: int = 4
    contention: float = 2.0
    cpu_s: float = 0.0
    alloc_mb: float = 0.0
    payload_kb: int = 16

    def expected_rate(self, workers: int, threads: int = 1) -> float:
        """Items/s the model predicts for `workers` workers (0 = in the consumer) and `threads`."""
        n = max(1, workers)
        slowdown = max(1.0, n / self.knee) ** self.contention
        per_item = (self.item_s + math.ceil(self.images_per_item / threads) * self.image_s) * slowdown + self.cpu_s

        return n / per_item


class SyntheticDataset(IterableDataset):
    """Endless synthetic packs; `counter` (a multiprocessing.Value, optional) counts items made."""

    def __init__(self, spec: SyntheticSpec, counter=None):
        super().__init__()
        self.spec = spec
        self.counter = counter
        self.decode_threads = 1

    def set_decode_threads(self, threads: int) -> None:
        self.decode_threads = int(threads)

    def tune_fingerprint(self) -> dict:
        return {"synthetic": asdict(self.spec)}

    def __iter__(self):
        spec = self.spec
        info = get_worker_info()
        n = info.num_workers if info is not None else 1
        slowdown = max(1.0, n / spec.knee) ** spec.contention
        ballast = np.ones(int(spec.alloc_mb * 2**20), dtype=np.uint8) if spec.alloc_mb else None
        payload = torch.zeros(spec.payload_kb * 256, dtype=torch.int32)
        pool = ThreadPoolExecutor(self.decode_threads) if spec.image_s > 0 else None
        try:
            while True:
                time.sleep(spec.item_s * slowdown)
                if pool is not None:
                    list(pool.map(time.sleep, [spec.image_s * slowdown] * spec.images_per_item))
                if spec.cpu_s:
                    _busy(spec.cpu_s)
                if self.counter is not None:
                    with self.counter.get_lock():
                        self.counter.value += 1
                yield {"input_ids": payload, "ballast_bytes": 0 if ballast is None else int(ballast.nbytes),
                       "stats": {"images": spec.images_per_item, "real_tokens": spec.tokens_per_item}}
        finally:
            if pool is not None:
                pool.shutdown(wait=False)


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1
