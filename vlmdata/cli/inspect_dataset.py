"""`vlmdata inspect`: counts, histograms, skipped samples and a few samples of a dataset."""
from __future__ import annotations

import argparse
import sys

from vlmdata.cli.options import parse_storage_options
from vlmdata.ingest.inspection import inspect_dataset


def register(subparsers) -> None:
    p = subparsers.add_parser("inspect", help="print counts, histograms, skipped samples and example samples")
    p.add_argument("dataset", help="dataset directory (local path or fsspec URL)")
    p.add_argument("--samples", type=int, default=3, help="how many samples to render (default 3)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="also say how many samples are longer than this budget (VLMDataset's max_tokens) and what "
                        "the loader does with them")
    p.add_argument("--image-size", type=int, default=None,
                   help="image tokens as VLMDataset(image_size=S) counts them (default: the dataset's own policy, "
                        "else 336)")
    p.add_argument("--storage-options", default=None, help="fsspec storage options as JSON, or @file.json")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        so = parse_storage_options(args.storage_options)
        print(inspect_dataset(args.dataset, so, samples=args.samples, max_tokens=args.max_tokens,
                              image_size=args.image_size))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
