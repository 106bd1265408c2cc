#!/usr/bin/env python3
"""Slowest / mean rank cost per step and packing efficiency, today's assignment vs compute-balanced steps.

    python tools/bench_balance.py [--samples 40000] [--worlds 8 64] [--max-tokens 8192] [--out FILE]

Planning columns are drawn from the benchmark corpus's distributions (vlmdata.testing: image counts,
caption words, the generator's image size mixture), as Qwen2-VL sees them: each image through the
family's smart_resize at up to 1280 tokens (DynamicPolicy, patch 14, merge 2), text tokens = 30 (chat
template) + 2 per image + one per caption word. Cost: vlmdata.plan.CostModel's default, a 7B LM +
600M ViT. Per world size, in the same run: the plain plan and assignment (`balance="none"`) and the
balanced one (`balance="compute"`), each step's slowest / mean rank cost (mean, p95) and the packing
efficiency (real tokens / (steps x world x max_tokens), the epoch's tail included).
Targets (issue 24): mean <= 1.03 at 8 ranks, <= 1.05 at 64, packing >= 99 %.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from vlmdata.decode import DynamicPolicy
from vlmdata.plan import Balance, Corpus, CostModel, EpochPlanner, PlanOptions, rank_packs, step_deal
from vlmdata.sysinfo import cpu_model
from vlmdata.testing import image_and_word_counts, image_sizes, write_report

QWEN2_VL = DynamicPolicy(patch=14, merge=2, min_pixels=56 * 56, max_pixels=1280 * 28 * 28)
TARGETS = {8: 1.03, 64: 1.05}


def columns(samples: int, per_shard: int, seed: int) -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = samples // per_shard * per_shard
    images, words = image_and_word_counts(rng, n)
    width, height = image_sizes(rng, int(images.sum()))
    cols = {"text_tokens": (30 + 2 * images + words).astype(np.int32), "n_images": images.astype(np.int16),
            "image_start": np.cumsum(images) - images, "width": width.astype(np.int32),
            "height": height.astype(np.int32)}
    return cols, np.full(n // per_shard, per_shard)


def measure(cols, sizes, world: int, balance: Balance, args) -> dict:
    opts = PlanOptions(max_tokens=args.max_tokens, max_images=args.max_images, window_shards=args.window_shards,
                       balance=balance)
    p = EpochPlanner(Corpus.build([cols], [sizes]), QWEN2_VL, opts, args.seed, 0)
    cost = CostModel().for_policy(QWEN2_VL)
    sample_cost, sample_tokens = {}, {}
    for g in range(p.total()):
        s, t, _ = p.pack_samples(g)
        vt, vs = p.pack_vision(g)
        sample_cost.update(zip(s.tolist(), cost.sample_costs(t, vt, vs).tolist()))
        sample_tokens.update(zip(s.tolist(), t.tolist()))
    t0 = time.perf_counter()
    full = p.total() // world
    deals = [step_deal(p, s * world, world, balance).samples if balance.active else
             [p.pack_samples(g)[0] for g in range(s * world, (s + 1) * world)] for s in range(full)]
    seconds = time.perf_counter() - t0                  # every rank computes each step's deal once
    if full * world < p.total():                        # the epoch's tail, split over all ranks
        deals.append([next(rank_packs(p, 0, world, r, full, 1, balance if balance.active else None)).samples
                      for r in range(world)])
    steps = len(deals)
    per_step = np.asarray([[sum(sample_cost[i] for i in part.tolist()) for part in deal] for deal in deals])
    ratio = per_step.max(axis=1) / per_step.mean(axis=1)
    real = sum(sample_tokens.values())
    return {"steps": steps, "mean": float(ratio.mean()), "p95": float(np.percentile(ratio, 95)),
            "packing": real / (steps * world * args.max_tokens), "ms_per_step": 1000 * seconds / max(1, full)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=40000)
    ap.add_argument("--worlds", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--max-images", type=int, default=64)
    ap.add_argument("--window-shards", type=int, default=8)
    ap.add_argument("--per-shard", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    cols, sizes = columns(args.samples, args.per_shard, args.seed)
    balanced = Balance(cost=CostModel().for_policy(QWEN2_VL))
    lines = [f"# bench_balance: {int(sizes.sum())} samples, Qwen2-VL <= 1280 tokens/image, "
             f"max_tokens {args.max_tokens}, 7B LM + 600M ViT FLOPs",
             f"machine: {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}",
             "", "| ranks | assignment | steps | slowest/mean mean | p95 | packing | target | met | deal ms/step |",
             "|---|---|---|---|---|---|---|---|---|"]
    for world in args.worlds:
        for name, balance in (("today (none)", Balance("none")), ("compute-balanced", balanced)):
            m = measure(cols, sizes, world, balance, args)
            target = TARGETS.get(world)
            met = "-" if target is None or not balance.active else \
                ("yes" if m["mean"] <= target and m["packing"] >= 0.99 else "no")
            lines.append(f"| {world} | {name} | {m['steps']} | {m['mean']:.4f} | {m['p95']:.4f} | "
                         f"{100 * m['packing']:.2f} % | {target or '-'} | {met} | {m['ms_per_step']:.1f} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    write_report(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
