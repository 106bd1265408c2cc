"""`vlmdata tune DATASET`: measure loader settings on this machine, print the table and the choice."""
from __future__ import annotations

import argparse
import json
import re
import sys

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}


def parse_size(text: str) -> int:
    """'8G', '512MiB', '1.5g', '1000000' -> bytes (binary units)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use a number with an optional unit, e.g. 8G or 512M")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def register(subparsers) -> None:
    p = subparsers.add_parser("tune", help="auto-tune DataLoader workers, prefetch depth and decode threads",
                              description="Run the loading pipeline briefly at candidate settings and cache "
                                          "the best for this (machine, dataset, pipeline settings).")
    p.add_argument("dataset", help="dataset directory or URL (as given to VLMDataset)")
    p.add_argument("--max-tokens", type=int, default=8192, help="tokens per pack (default 8192)")
    p.add_argument("--image-size", type=int, default=336, help="fixed image side in pixels (default 336)")
    p.add_argument("--max-images", type=int, default=None,
                   help="images per pack at most (default: the image policy's budget: 16 for fixed-size images, "
                        "a vision-patch budget and no image cap for dynamic resolution)")
    p.add_argument("--decoder", default="auto", choices=("auto", "pillow", "dali"))
    p.add_argument("--pixels", default=None, choices=("exact", "fast"),
                   help="exact: the model's image processor's pixels, bit for bit (default for a dataset sharded "
                        "with a model folder); fast: JPEG draft decode + bilinear (default otherwise)")
    p.add_argument("--memory-budget", type=parse_size, default=None,
                   help="memory the loader may use, e.g. 8G (default: half of RAM / local ranks)")
    p.add_argument("--time-budget", type=float, default=120.0, help="seconds the search may take (default 120)")
    p.add_argument("--measure-seconds", type=float, default=2.0, help="measurement window per candidate")
    p.add_argument("--cpus", type=int, default=None, help="CPUs to tune for (default: this process's affinity)")
    p.add_argument("--consumer-cores", type=float, default=1.0,
                   help="CPUs the training step keeps busy, emulated while measuring (default 1; 0 = loader alone)")
    p.add_argument("--cache", default=None, help="cache file (default $VLMDATA_CACHE_DIR/tune.json or "
                                                  "~/.cache/vlmdata/tune.json)")
    p.add_argument("--force", action="store_true", help="re-tune even if a cached result exists")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vlmdata.errors import ConfigError
    from vlmdata.loading.dataset import DatasetOptions, VLMDataset
    from vlmdata.tune.settings import TuneBudget, TuneConfig
    from vlmdata.tune.tuner import format_table, tune_cached

    if args.max_tokens <= 0 or args.image_size <= 0 or args.time_budget <= 0 or args.measure_seconds <= 0:
        print("vlmdata tune: --max-tokens, --image-size, --time-budget and --measure-seconds must be > 0",
              file=sys.stderr)
        return 2
    if args.consumer_cores < 0:
        print("vlmdata tune: --consumer-cores must be >= 0", file=sys.stderr)
        return 2
    try:
        ds = VLMDataset(args.dataset, max_tokens=args.max_tokens, max_images=args.max_images,
                        image_size=args.image_size, decoder=args.decoder, rank=0, world_size=1,
                        options=DatasetOptions(pixels=args.pixels))
    except ConfigError as exc:
        print(f"vlmdata tune: {exc}", file=sys.stderr)
        return 2
    result = tune_cached(ds, budget=TuneBudget(args.memory_budget, args.time_budget),
                         config=TuneConfig(measure_s=args.measure_seconds, cpu_count=args.cpus,
                                           consumer_cores=args.consumer_cores),
                         cache_path=args.cache, force=args.force)
    if args.json:
        print(json.dumps({**result.to_dict(), "from_cache": result.from_cache}, indent=1))
    else:
        print(format_table(result))
    return 0
