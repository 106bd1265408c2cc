"""Small corpora and settings on which the bounded-memory planner is compared with the reference planner.

`CASES` covers one dataset (pack and bucket modes, overlong truncate/drop, too many images, empty shards),
several mixed datasets (weights, repeats, mix_samples) and a dynamic image policy. `schedule_digest`
reduces everything a plan decides (each rank's and worker's packs, steps, resume cursors, windows and
dropped counts) to one hash, so that a recorded digest proves equality with code that no longer exists.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from tests.helpers.plan import synthetic_columns
from vlmdata.decode import DynamicPolicy, FixedPolicy


@dataclass
class PlanCase:
    name: str
    sources: list[dict]                      # synthetic_columns kwargs per dataset
    weights: list[float] | None = None
    options: dict = field(default_factory=dict)
    policy: object = FixedPolicy(112, 14)
    empty_shards: tuple[int, ...] = ()       # shards of the first dataset emptied (0 samples)
    overlong_shards: tuple[int, ...] = ()    # shards of the first dataset whose samples are all overlong


CASES = [
    PlanCase("pack", [dict(n_shards=30, seed=0)]),
    PlanCase("pack-overlong-truncate", [dict(n_shards=23, seed=3, long_frac=0.05)], options=dict(max_images=16)),
    PlanCase("pack-overlong-drop", [dict(n_shards=23, seed=4, long_frac=0.08)], options=dict(overlong="drop")),
    PlanCase("too-many-images", [dict(n_shards=17, seed=5, max_images=6)], options=dict(max_images=5)),
    PlanCase("bucket", [dict(n_shards=19, seed=6)], options=dict(mode="bucket")),
    PlanCase("empty-shards", [dict(n_shards=21, seed=7)], empty_shards=(0, 1, 2, 3, 9, 20)),
    PlanCase("packless-windows", [dict(n_shards=16, seed=0)], options=dict(window_shards=2, overlong="drop"),
             empty_shards=(0, 3, 5, 8, 12), overlong_shards=(1, 2, 6, 9, 13, 14)),
    PlanCase("mix", [dict(n_shards=10, seed=1), dict(n_shards=20, seed=2)], weights=[3.0, 1.0]),
    PlanCase("mix-samples", [dict(n_shards=6, seed=1), dict(n_shards=7, seed=2), dict(n_shards=3, seed=8)],
             weights=[1.0, 2.0, 0.5], options=dict(window_shards=2, mix_samples=301)),
    PlanCase("dynamic", [dict(n_shards=12, seed=9)], options=dict(max_tokens=4096),
             policy=DynamicPolicy(patch=14, merge=2, min_pixels=56 * 56, max_pixels=224 * 224)),
]

SCHEDULES = [(1, 1), (2, 3), (3, 2), (4, 1), (7, 3)]     # (world size, DataLoader workers)


def case_columns(case: PlanCase) -> tuple[list[dict], list[np.ndarray]]:
    """The case's planning columns and shard sizes (empty shards removed from the first dataset's columns)."""
    cols, sizes = [], []
    for i, kw in enumerate(case.sources):
        c, s = synthetic_columns(**kw)
        if i == 0 and case.overlong_shards:
            c["text_tokens"] = np.where(np.isin(c["shard"], list(case.overlong_shards)), 20000, c["text_tokens"])
            c["text_tokens"] = c["text_tokens"].astype(np.int32)
        if i == 0 and case.empty_shards:
            keep = ~np.isin(c["shard"], list(case.empty_shards))
            img_keep = np.repeat(keep, c["n_images"])
            c = {k: (v[img_keep] if k in ("width", "height") else v[keep]) for k, v in c.items()}
            c["image_start"] = (np.cumsum(c["n_images"], dtype=np.int64) - c["n_images"]).astype(np.int64)
            c["local"] = np.concatenate([np.arange(int((c["shard"] == j).sum()), dtype=np.int32)
                                         for j in range(len(s))])
            s = s.copy()
            s[list(case.empty_shards)] = 0
        cols.append(c)
        sizes.append(s)
    return cols, sizes


def plan_options(case: PlanCase, options_cls):
    return options_cls(**{"max_tokens": 2048, "max_images": 8, "window_shards": 4, **case.options})


def schedule_items(make_planner, rank_packs, world: int, workers: int, base: int = 0) -> list:
    """Every (rank, worker)'s items as plain data: samples, step, cursor, window, drops."""
    out = []
    for r in range(world):
        for w in range(workers):
            for a in rank_packs(make_planner(), base, world, r, w, workers):
                out.append([r, w, a.samples.tolist(), a.step, a.cursor, a.window, sorted(a.dropped.items())])
    return out


def planner_facts(p) -> list:
    """Per global pack: samples, tokens, images, drops; plus the epoch's total."""
    n = p.total()
    return [n] + [[p.pack_samples(g)[0].tolist(), p.pack_samples(g)[1].tolist(), p.pack_samples(g)[2].tolist(),
                   sorted(p.drops_at(g).items())] for g in range(n)]


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, separators=(",", ":")).encode()).hexdigest()[:32]


# sha256 digests of [planner_facts, schedule_items for SCHEDULES] with seed 11, epoch 2, recorded from
# vlmdata/plan (EpochPlanner, rank_packs) as it was on main before issue 15 (the code now kept in
# tests/helpers/reference_plan.py gave the same digests).
RECORDED = {
    "pack": "2ec28e663e565da6b273abf4c97ac9e1",
    "pack-overlong-truncate": "17173482608b33397762ff580bd34762",
    "pack-overlong-drop": "a5b4da116cfea54f44362a2ee762808b",
    "too-many-images": "1ba0d6158bb63ff157e9719ca769400e",
    "bucket": "9f607181abe31cb85fd8a09498753899",
    "empty-shards": "e0c584c1f1d0158cd821711f8e141d2f",
    "packless-windows": "2a307a14f6c6bb5bc8cb0a1f476b7f45",
    "mix": "3382e44beae915573abe6d2bf1020355",
    "mix-samples": "97970a4f1f2cf2da435b445489f96b98",
    "dynamic": "5cb49ecfa8f02fa8cbcaca01921e5e34",
}
