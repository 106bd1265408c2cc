"""`vlmdata show`: samples by key (e.g. a batch's `sample_keys`): text decoded with the view's own tokenizer,
images and trained spans marked, token counts, metadata, where they live, and their images written to files."""
from __future__ import annotations

import argparse
import sys

from vlmdata.cli.options import parse_storage_options
from vlmdata.ingest.show import show_samples


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "show", help="show samples by key: text with token count and trained spans, metadata, location, images",
        description="Look samples up by key in the dataset's keys.lmdb and print them as stored: where each lives "
                    "(shard, row, bytes), its text with the token count and the spans the loss is computed on, "
                    "its source record, its images (written to files with --images).")
    p.add_argument("dataset", help="dataset directory (local path or fsspec URL)")
    p.add_argument("keys", nargs="+", metavar="KEY", help="sample keys, as in a batch's sample_keys")
    p.add_argument("--images", metavar="DIR", default=None, help="write each sample's images into DIR")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--view", default=None, metavar="NAME",
                   help="the text view to decode (`vlmdata retokenize` adds views; default: the dataset's default)")
    p.add_argument("--tokenizer", default=None, metavar="MODEL_DIR",
                   help="the view's model folder, when it is not where the dataset was tokenized (checked by hash)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="trained text in green, images in cyan (auto: on a terminal); else trained text in ⟦…⟧")
    p.add_argument("--storage-options", default=None, help="fsspec storage options as JSON, or @file.json")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        so = parse_storage_options(args.storage_options)
        color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
        text, missing = show_samples(args.dataset, args.keys, so, args.images, as_json=args.json, view=args.view,
                                     tokenizer_dir=args.tokenizer, color=color)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        print(text, flush=True)
    except BrokenPipeError:                 # e.g. piped into `head`
        sys.stderr.close()
    return 1 if missing else 0
