"""Synthetic shard access traces (window shuffle) and an offline cache simulator.

Used by the cache benchmark and tests: the same trace drives the real cache (through moto S3)
and this simulator, so measured fetch counts can be checked against the ideal.
"""
from __future__ import annotations

import random

from vlmdata.cache.eviction import PlanBook, choose_victims


def window_shuffle_trace(n_shards: int, window: int, epochs: int, seed: int = 0,
                         reads_per_shard: int = 4) -> list[int]:
    """Shard ids in access order: per epoch, shuffle the shard order, cut it into windows of
    `window` shards, and read each window's samples in shuffled order (`reads_per_shard` reads of
    each shard, interleaved), the way the loader's window shuffle reads shards."""
    rng = random.Random(seed)
    out: list[int] = []
    for _ in range(epochs):
        order = list(range(n_shards))
        rng.shuffle(order)
        for w in range(0, n_shards, window):
            reads = [s for s in order[w:w + window] for _ in range(reads_per_shard)]
            rng.shuffle(reads)
            out.extend(reads)
    return out


def simulate(trace: list[int], capacity: int, policy: str) -> int:
    """Fetches a cache of `capacity` equal-size items makes on `trace` (every miss is admitted)."""
    keys = [str(k) for k in trace]
    plans = PlanBook()
    plans.set(0, keys)
    cache: dict[str, None] = {}  # insertion order = LRU order
    fetches = 0
    for key in keys:
        plans.consume(0, key)
        if key in cache:
            cache.pop(key)
            cache[key] = None
            continue
        fetches += 1
        cache[key] = None
        if len(cache) > capacity:
            cands = [k for k in cache if k != key]  # a demanded key is always admitted
            victim = choose_victims(cands, dict.fromkeys(cands, 1), 1, policy, plans)[0]
            del cache[victim]
    return fetches
