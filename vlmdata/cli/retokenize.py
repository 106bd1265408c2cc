"""`vlmdata retokenize`: add another model's text view to a sharded dataset (no image bytes read)."""
from __future__ import annotations

import argparse
import sys

from vlmdata.cli.options import add_max_skip_fraction, parse_storage_options, run_reported
from vlmdata.cli.tune import parse_size
from vlmdata.ingest.retokenize import DEFAULT_MAX_TEXT_BYTES, RetokenizeConfig, retokenize_dataset
from vlmdata.text.families.registry import family_names


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "retokenize", help="add a text view for another model's tokenizer and chat template to a dataset",
        description="Write the token ids of another model (tokenizer, chat template, image tokens) beside the shards "
                    "of DATASET as a named text view, reading only each sample's text; load it with "
                    "VLMDataset(DATASET, text_view=NAME).")
    p.add_argument("dataset", help="the dataset directory (local path or fsspec URL)")
    p.add_argument("--tokenizer", required=True, help="a Hugging Face model or processor folder")
    p.add_argument("--view", default=None, help="the view's name (default: the model folder's name)")
    p.add_argument("--train-on", choices=("assistant", "last", "all"), default="assistant",
                   help="train on every assistant reply and its end-of-turn token (default), the last reply only, "
                        "or all tokens")
    p.add_argument("--family", default=None, help=f"force the model family ({family_names()}; default: from the folder)")
    p.add_argument("--default", action="store_true", help="make the new view the dataset's default view")
    p.add_argument("--overwrite", action="store_true", help="replace an existing view of the same name")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: CPU count; 0 = inline)")
    p.add_argument("--storage-options", default=None, help="fsspec storage options as JSON, or @file.json")
    p.add_argument("--no-fsync", action="store_true", help="do not fsync local files before renaming them")
    add_max_skip_fraction(p, "samples")
    p.add_argument("--max-text-bytes", type=parse_size, default=DEFAULT_MAX_TEXT_BYTES,
                   help="skip (and count as text_too_large) samples whose stored text is larger, e.g. 4M "
                        "(default 1M); they are never read")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        so = parse_storage_options(args.storage_options)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cfg = RetokenizeConfig(dataset=args.dataset, tokenizer=args.tokenizer, view=args.view, train_on=args.train_on,
                           family=args.family, workers=args.workers, make_default=args.default,
                           overwrite=args.overwrite, storage_options=so, fsync=not args.no_fsync,
                           max_skip_fraction=args.max_skip_fraction, max_text_bytes=args.max_text_bytes)

    def report(result, dt: float) -> None:
        skipped = ", ".join(f"{k}={v}" for k, v in result.skipped.items()) or "none"
        print(f"view {result.view}: {result.encoded} of {result.samples} samples encoded in {dt:.1f}s "
              f"({result.samples / max(dt, 1e-9):.0f} samples/s), read {result.bytes_read / 1e6:.2f} MB (no image "
              f"bytes); skipped {sum(result.skipped.values())} ({skipped}); load it with text_view={result.view!r}")

    return run_reported(lambda update: retokenize_dataset(cfg, (lambda n: update(n, n)) if update else None), report)
