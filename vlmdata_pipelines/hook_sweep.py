"""Several DDP communication settings side by side in ONE torchrun job, so that their trade shows:

    python -m torch.distributed.run --nproc_per_node 2 -m vlmdata_pipelines.hook_sweep --data DIR \\
        --configs none,bf16,fp16,powersgd --steps 40 [--accum 2] [--model small] --out OUT

Each config is `HOOK[+static][+noview][+rankN][+startN]`: a `--comm-hook`, optionally with
`--ddp-static-graph`, without gradient-as-bucket-view, or with its own PowerSGD rank / warm-up start
(e.g. `powersgd+rank4`); what a config leaves out comes from the command line. Every config gets its own `vlmdata_pipelines.train.Trainer` (its own
DDP model with its hook registered, the same initial weights, the same optimizer settings) and
the same packs: each rank reads steps x accum packs once, before any clock, and every trainer
iterates over that same list. The trainers then take their steps interleaved (step 1 of every
config, step 2 of every config, ...; the order rotates), so machine noise hits them all alike.

Written: OUT/<config>/result.rank<r>.json (the trainer's summary: losses, bytes all-reduced per step,
tokens/s, parameter checksum) and, by rank 0, OUT/sweep.json with every config's figures and
every rank's checksum.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from dataclasses import asdict, replace

import torch.distributed as dist

from vlmdata import fsutil
from vlmdata_pipelines.comm import COMM_HOOKS, CommOptions
from vlmdata_pipelines.data import DataOptions, DatasetSource, ListSource, model_fields_for
from vlmdata_pipelines.model import VLMConfig
from vlmdata_pipelines.train import TrainConfig, Trainer, init_distributed

__all__ = ["parse_config", "run_sweep"]

log = logging.getLogger("vlmdata_pipelines.hook_sweep")


def parse_config(spec: str, base: CommOptions) -> CommOptions:
    """`HOOK[+static][+noview][+rankN][+startN]` -> CommOptions (the rest from `base`)."""
    hook, *mods = spec.split("+")
    if hook not in COMM_HOOKS:
        raise ValueError(f"config {spec!r}: unknown hook {hook!r} (one of {', '.join(COMM_HOOKS)})")
    opts = replace(base, hook=hook)
    for mod in mods:
        if mod == "static":
            opts = replace(opts, static_graph=True)
        elif mod == "noview":
            opts = replace(opts, gradient_as_bucket_view=False)
        elif re.fullmatch(r"rank\d+", mod):
            opts = replace(opts, powersgd_rank=int(mod[4:]))
        elif re.fullmatch(r"start\d+", mod):
            opts = replace(opts, powersgd_start_iter=int(mod[5:]))
        else:
            raise ValueError(f"config {spec!r}: unknown modifier {mod!r} (static, noview, rankN, startN)")
    opts.validate()
    return opts


def _load_packs(data: DataOptions, rank: int, world_size: int, count: int) -> list[dict]:
    """This rank's first `count` packs (across epochs), read once, in this process."""
    packs = []
    for batch in DatasetSource(data, rank, world_size):
        packs.append(batch)
        if len(packs) == count:
            break
    return packs


def run_sweep(configs: list[str], base: TrainConfig, model_cfg: VLMConfig, data: DataOptions) -> dict:
    """Train every config on this rank, interleaved; returns {config: this rank's summary}."""
    info = init_distributed()
    comms = {spec: parse_config(spec, base.comm) for spec in configs}
    packs = _load_packs(data, info.rank, info.world_size, base.steps * base.accum)
    trainers, iters = {}, {}
    for spec, comm in comms.items():
        out = os.path.join(base.out_dir, spec) if base.out_dir else None
        trainers[spec] = Trainer(replace(base, comm=comm, out_dir=out), model_cfg, info)
        iters[spec] = iter(ListSource(packs))
    try:
        for step in range(base.steps):
            k = step % len(configs)
            for spec in configs[k:] + configs[:k]:
                trainers[spec].records.append(trainers[spec].train_step(step, iters[spec]))
            if info.rank == 0 and (step % base.log_every == 0 or step == base.steps - 1):
                log.info("step %d: %s", step + 1, "  ".join(
                    f"{spec} loss {trainers[spec].records[-1].loss:.4f} "
                    f"{trainers[spec].records[-1].allreduce_bytes / 1e6:.2f} MB" for spec in configs))
        results = {spec: tr.summary() for spec, tr in trainers.items()}
    finally:
        for tr in trainers.values():
            tr.close()
    for spec, result in results.items():
        if base.out_dir:
            fsutil.atomic_write_bytes(os.path.join(base.out_dir, spec, f"result.rank{info.rank}.json"),
                                      json.dumps(result, indent=1).encode())
    checksums = [None] * info.world_size
    dist.all_gather_object(checksums, {spec: r["checksum"] for spec, r in results.items()})
    if info.rank == 0 and base.out_dir:
        sweep = {"world_size": info.world_size, "steps": base.steps, "accum": base.accum,
                 "model": model_cfg.to_dict(), "configs": {}}
        for spec, r in results.items():
            sweep["configs"][spec] = {
                "options": asdict(comms[spec]), "losses": r["losses"], "grad_norms": r["grad_norms"],
                "allreduce_bytes_per_step": r["comm"]["allreduce_bytes_per_step"],
                "tokens_per_second": r["tokens_per_second"], "seconds": r["seconds"],
                "steady_steps": r["steady_steps"], "checksums": [c[spec] for c in checksums]}
        fsutil.atomic_write_bytes(os.path.join(base.out_dir, "sweep.json"), json.dumps(sweep, indent=1).encode())
    return results


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vlmdata_pipelines.hook_sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--configs", default="none,bf16,fp16,powersgd",
                   help="comma-separated HOOK[+static][+noview][+rankN][+startN]")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--model", default="tiny", choices=("tiny", "small", "base"))
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--image-size", type=int, default=56)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--powersgd-rank", type=int, default=2)
    p.add_argument("--powersgd-start-iter", type=int, default=10)
    p.add_argument("--ddp-bucket-mb", type=float, default=25.0)
    p.add_argument("--log-every", type=int, default=5)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    configs = [c for c in args.configs.split(",") if c]
    if len(set(configs)) != len(configs) or not configs:
        raise SystemExit(f"--configs must name distinct configs, got {args.configs!r}")
    data = DataOptions(data=args.data, max_tokens=args.max_tokens, image_size=args.image_size, num_workers=0,
                       decoder="pillow", seed=args.seed, decode_stage="off")
    model_cfg = VLMConfig.preset(args.model, attn_backend="reference", **model_fields_for(data))
    base = TrainConfig(steps=args.steps, accum=args.accum, lr=args.lr, seed=args.seed, out_dir=args.out,
                       log_every=args.log_every,
                       comm=CommOptions(bucket_mb=args.ddp_bucket_mb, powersgd_rank=args.powersgd_rank,
                                        powersgd_start_iter=args.powersgd_start_iter))
    try:
        run_sweep(configs, base, model_cfg, data)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
