#!/usr/bin/env python3
"""A real 2-rank run of compute-balanced steps: each rank's forward + backward time per step, before and after.

    torchrun --nproc-per-node 2 tools/balance_torchrun.py [--samples 300] [--steps 16] [--cache DIR]

Each rank (torchrun, gloo, CPU) reads its own packs from a VLMDataset over the benchmark corpus
(vlmdata.testing.bench_corpus: real JPEGs of the generator's size mixture, tar shards), with a dynamic
image policy (patch 14, merge 2, up to 256 tokens per image), `balance="none"` and then `"compute"`
with the cost model of the model it trains (the reference TinyVLM, 'small' preset, merge 2). For each
step every rank times its pack's forward + backward alone (no gradient sync, best of `--repeats`, one
thread), and rank 0 reports per step the slowest / mean rank time and the cost model's prediction.

What a CPU run shows: whether the ranks' compute times follow the cost model, and how much of the
spread balancing removes on a real model and loader. What it cannot: GPU kernels' efficiency at
these sizes (on a GPU the linear layers dominate and attention is cheaper per FLOP), NCCL waits, and
on a shared machine the timings carry other processes' noise.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import torch.distributed as dist

from vlmdata.decode import DynamicPolicy
from vlmdata.loading import DatasetOptions, VLMDataset, make_loader
from vlmdata.plan import Balance, CostModel, lm_coefficients, vit_coefficients
from vlmdata.testing import bench_corpus
from vlmdata_pipelines.data import batch_to_device
from vlmdata_pipelines.model import TinyVLM, VLMConfig

POLICY = DynamicPolicy(patch=14, merge=2, min_pixels=56 * 56, max_pixels=256 * 28 * 28)


def model_cost(cfg: VLMConfig) -> CostModel:
    """The cost model of the TinyVLM it trains (SwiGLU hidden ~ 8/3 dim)."""
    lm = lm_coefficients(cfg.dim, cfg.n_layers, 3 * cfg.dim, cfg.n_heads, cfg.n_heads, cfg.vocab_size)
    vit = vit_coefficients(cfg.vision_dim, cfg.vision_layers, 4 * cfg.vision_dim)
    return CostModel(lm[0], lm[1], vit[0], vit[1], cfg.merge * cfg.merge)


def pack_seconds(model: TinyVLM, batch: dict, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        loss, _ = model(batch_to_device(batch, torch.device("cpu")))
        loss.backward()
        best = min(best, time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    return best


def run(data: str, balance: Balance, model: TinyVLM, args, rank: int, world: int) -> tuple[np.ndarray, np.ndarray]:
    ds = VLMDataset(data, seed=0, max_tokens=args.max_tokens, max_images=32, image_size=POLICY, rank=rank,
                    world_size=world, decoder="pillow", options=DatasetOptions(balance=balance))
    measured, predicted = [], []
    cost = balance.cost.for_policy(POLICY)
    for i, batch in enumerate(make_loader(ds, num_workers=0)):
        if i >= args.steps:
            break
        seconds = torch.tensor([pack_seconds(model, batch, args.repeats)], dtype=torch.float64)
        lengths = np.diff(batch["cu_seqlens"].numpy())
        grid = batch.get("image_grid")
        img_tokens = (grid.prod(dim=1).numpy() // (POLICY.merge ** 2)) if grid is not None and len(grid) else []
        flops = cost.sample_costs(lengths, np.zeros(len(lengths)), np.zeros(len(lengths))).sum() + \
            cost.sample_costs(np.zeros(len(img_tokens)), img_tokens, np.square(img_tokens)).sum()
        both = torch.tensor([float(seconds), flops], dtype=torch.float64)
        got = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(got, both)
        rows = torch.stack(got).numpy()
        measured.append(rows[:, 0].max() / rows[:, 0].mean())
        predicted.append(rows[:, 1].max() / rows[:, 1].mean())
    return np.asarray(measured), np.asarray(predicted)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/vlmdata-bench"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        bench_corpus(args.cache, args.samples, image_size=None)
    dist.barrier()
    data = bench_corpus(args.cache, args.samples, image_size=None).wds
    torch.manual_seed(0)
    cfg = VLMConfig.preset("small", merge=2, attn_backend="auto")
    model = TinyVLM(cfg)
    results = {}
    for name in ("none", "compute"):
        results[name] = run(data, Balance(name, cost=model_cost(cfg)), model, args, rank, world)
    if rank == 0:
        print(f"# balance_torchrun: {world} ranks (gloo, CPU, 1 thread each), TinyVLM small merge 2, "
              f"max_tokens {args.max_tokens}, {args.steps} steps, best of {args.repeats}")
        print("| balance | measured slowest/mean: mean | p95 | cost model's: mean | p95 |")
        print("|---|---|---|---|---|")
        for name, (m, p) in results.items():
            print(f"| {name} | {m.mean():.3f} | {np.percentile(m, 95):.3f} | {p.mean():.3f} | "
                  f"{np.percentile(p, 95):.3f} |")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
