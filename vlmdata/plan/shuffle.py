"""Deterministic shuffles: every random choice is a pure function of (seed, purpose, keys...)."""
from __future__ import annotations

import numpy as np

# purpose tags, so that different choices never share a random stream
SHARD_ORDER = 1
WINDOW_SAMPLES = 2
PACK_ORDER = 3
MIX_SAMPLES = 4


def make_rng(seed: int, purpose: int, *keys: int) -> np.random.Generator:
    """A generator seeded by (seed, purpose, keys); equal inputs give equal streams."""
    entropy = [int(seed) & 0xFFFFFFFFFFFFFFFF, int(purpose), *(int(k) & 0xFFFFFFFFFFFFFFFF for k in keys)]
    return np.random.default_rng(np.random.SeedSequence(entropy))


def shard_order(n_shards: int, seed: int, *keys: int) -> np.ndarray:
    """A permutation of shard numbers."""
    return make_rng(seed, SHARD_ORDER, *keys).permutation(n_shards).astype(np.int64)


def shuffled(items: np.ndarray, seed: int, purpose: int, *keys: int) -> np.ndarray:
    """A shuffled copy of `items`."""
    return items[make_rng(seed, purpose, *keys).permutation(len(items))]
