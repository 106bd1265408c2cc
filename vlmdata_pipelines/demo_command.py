"""`vlmdata demo`: corpus -> shards -> packed 2-rank training, with throughput, data-wait and cache figures."""
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="generate, shard and train a tiny VLM on 2 local ranks",
                              description="Generate a corpus, shard it, train a few dozen packed steps on local "
                                          "ranks with torchrun (through the cache daemon when available) and print "
                                          "what ran and what it measured: real tokens/s, images/s, data-wait fraction, "
                                          "packing efficiency and the cache hit rate (with the daemon). About a "
                                          "minute on 2 CPU cores with the defaults.")
    p.add_argument("--workdir", help="keep everything here (default: a temporary directory, removed at the end)")
    p.add_argument("--samples", type=int, default=200, help="corpus size")
    p.add_argument("--steps", type=int, default=30, help="training steps")
    p.add_argument("--nproc", type=int, default=2, help="local ranks")
    p.add_argument("--corpus", choices=("raw", "learnable"), default="raw",
                   help="raw: the benchmark corpus (realistic sizes, long-tailed texts); learnable: a small "
                        "corpus whose loss falls fast")
    p.add_argument("--image-size", type=int, default=56, help="fixed image side in pixels (multiple of 14)")
    p.add_argument("--max-tokens", type=int, default=1024, help="tokens per pack")
    p.add_argument("--model", choices=("tiny", "small", "base"), default="small")
    p.add_argument("--num-workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--no-daemon", action="store_true", help="read shards directly, without the cache daemon")
    p.add_argument("--keep", action="store_true", help="keep the temporary work directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vlmdata_pipelines.demo import DemoConfig, report, run_demo

    cfg = DemoConfig(workdir=args.workdir, samples=args.samples, steps=args.steps, nproc=args.nproc,
                     corpus=args.corpus, image_size=args.image_size, max_tokens=args.max_tokens, model=args.model,
                     num_workers=args.num_workers, daemon=not args.no_daemon, keep=args.keep)
    print(report(run_demo(cfg)))
    return 0
