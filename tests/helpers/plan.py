"""Synthetic planning columns (no I/O) and an epoch planner over them."""
import numpy as np

from vlmdata.decode import FixedPolicy
from vlmdata.plan import Corpus, EpochPlanner, PlanOptions


def synthetic_columns(n_shards=30, seed=0, per_shard=(20, 60), max_images=4, long_frac=0.0):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(per_shard[0], per_shard[1], n_shards)
    n = int(sizes.sum())
    n_images = rng.integers(0, max_images + 1, n).astype(np.int16)
    text = rng.integers(20, 900, n).astype(np.int32)
    text[rng.random(n) < long_frac] = 20000
    m = int(n_images.sum())
    cols = {"shard": np.repeat(np.arange(n_shards, dtype=np.int32), sizes),
            "local": np.concatenate([np.arange(s, dtype=np.int32) for s in sizes]),
            "text_tokens": text, "n_images": n_images,
            "image_start": (np.cumsum(n_images, dtype=np.int64) - n_images),
            "width": rng.integers(50, 1500, m).astype(np.int32), "height": rng.integers(50, 1500, m).astype(np.int32)}
    return cols, sizes


FIXED112 = FixedPolicy(112, 14)


def planner(cols, sizes, seed=0, epoch=0, policy=FIXED112, **opt):
    opts = PlanOptions(**{"max_tokens": 2048, "max_images": 8, "window_shards": 4, **opt})
    return EpochPlanner(Corpus.build([cols], [sizes]), policy, opts, seed, epoch)
