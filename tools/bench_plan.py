#!/usr/bin/env python3
"""Planning speed on a synthetic 10M-sample index: time to the first packs and to a whole epoch's plan.

    python tools/bench_plan.py [--samples 10000000] [--shard-samples 5000] [--window-shards 8]

Columns follow gen_raw.py's distributions (0-8 images of mixed sizes, long-tailed text).
Targets (issue 3): first packs < 1 s, whole epoch < 30 s. Baseline in the same run:
the same windows packed with best-fit-decreasing (the classic baseline packer) and
with first-fit over a plain Python list, on the first window only (time per window).
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from vlmdata.decode import FixedPolicy
from vlmdata.plan import Corpus, EpochPlanner, PlanOptions, best_fit_decreasing, pack, sample_lengths
from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import image_and_word_counts  # noqa: E402

WORD_LEN = 4.6   # mean word length of gen_raw's vocabulary, + 1 space


def machine() -> str:
    cpu = cpu_model()
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, numpy {np.__version__}"


def synthetic_columns(n: int, shard_samples: int, seed: int = 0) -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(seed)
    k, words = image_and_word_counts(rng, n)
    k = k.astype(np.int16)
    text = (25 + k + words * (WORD_LEN + 1) + rng.normal(0, 1, n) * np.sqrt(words) * 2).astype(np.int32)
    m = int(k.sum())
    u = rng.random(m)
    w = np.where(u < 0.7, rng.integers(320, 641, m), np.where(u < 0.9, rng.integers(800, 1345, m), rng.integers(64, 321, m)))
    h = np.where(u < 0.7, rng.integers(240, 641, m), np.where(u < 0.9, rng.integers(800, 1345, m), rng.integers(64, 321, m)))
    n_shards = -(-n // shard_samples)
    sizes = np.full(n_shards, shard_samples, np.int64)
    sizes[-1] = n - shard_samples * (n_shards - 1)
    cols = {"shard": np.repeat(np.arange(n_shards, dtype=np.int32), sizes),
            "local": (np.arange(n) - np.repeat(np.cumsum(sizes) - sizes, sizes)).astype(np.int32),
            "text_tokens": text, "n_images": k, "image_start": np.cumsum(k, dtype=np.int64) - k,
            "width": w.astype(np.int32), "height": h.astype(np.int32)}
    return cols, sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=10_000_000)
    ap.add_argument("--shard-samples", type=int, default=5000)
    ap.add_argument("--window-shards", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8192)
    a = ap.parse_args()
    print(f"machine: {machine()}")
    t = time.perf_counter()
    cols, sizes = synthetic_columns(a.samples, a.shard_samples)
    print(f"synthetic planning columns: {a.samples:,} samples, {len(sizes):,} shards, "
          f"{int(cols['n_images'].sum()):,} images ({time.perf_counter() - t:.1f} s to make)")
    policy = FixedPolicy(336, 14)
    opts = PlanOptions(max_tokens=a.max_tokens, max_images=16, window_shards=a.window_shards)

    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores "
          "(the machine is shared: CPU seconds are the fair figure, wall seconds include waiting for a core)")
    t0, c0 = time.perf_counter(), time.process_time()
    planner = EpochPlanner(Corpus.build([cols], [sizes]), policy, opts, seed=0, epoch=0)
    first = planner.pack_samples(0)
    t_first, c_first = time.perf_counter() - t0, time.process_time() - c0
    print(f"first pack ready: {t_first:.3f} s wall, {c_first:.3f} s CPU  ({len(first[0])} samples; target < 1 s)")

    n_packs = planner.total()
    t_epoch, c_epoch = time.perf_counter() - t0, time.process_time() - c0
    print(f"whole epoch planned: {t_epoch:.1f} s wall, {c_epoch:.1f} s CPU  ({planner.num_windows} windows, "
          f"{n_packs:,} packs; target < 30 s); load average after: {os.getloadavg()[0]:.1f}")

    # baseline on one window: best-fit decreasing vs ours
    samples = planner.window_samples(0)
    lengths, _ = sample_lengths(cols, samples, policy)
    lengths = np.minimum(lengths, a.max_tokens)
    imgs = cols["n_images"][samples].astype(np.int64)
    t0 = time.perf_counter()
    _, b_ours = pack(lengths, imgs, a.max_tokens, 16)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, b_bfd = best_fit_decreasing(lengths, imgs, a.max_tokens, 16)
    t_bfd = time.perf_counter() - t0
    fill = lambda b: lengths.sum() / ((len(b) - 1) * a.max_tokens)  # noqa: E731
    print(f"one window of {len(samples):,} samples: vlmdata pack {t_ours:.3f} s ({fill(b_ours):.2%} fill), "
          f"best-fit-decreasing {t_bfd:.3f} s ({fill(b_bfd):.2%} fill); speed ratio {t_bfd / t_ours:.2f}x")
    print(f"RESULT first_pack_s={t_first:.3f} (cpu {c_first:.3f}) epoch_s={t_epoch:.1f} (cpu {c_epoch:.1f}) "
          f"packs={n_packs} targets_met_cpu={c_first < 1 and c_epoch < 30}")


if __name__ == "__main__":
    main()
