"""`vlmdata index`: index existing WebDataset shards (plain or gzip tars) in place."""
from __future__ import annotations

import argparse
import sys

from vlmdata.cli.options import (
    add_max_skip_fraction,
    parse_storage_options,
    print_lengths,
    run_reported,
    run_with_progress,
    skipped_summary,
)
from vlmdata.cli.tune import parse_size
from vlmdata.ingest.access import DEFAULT_MAX_IMAGE_BYTES
from vlmdata.ingest.images import DEFAULT_MAX_PIXELS
from vlmdata.ingest.index_foreign import IndexConfig, index_dataset
from vlmdata.keyindex.build import rebuild_keys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "index", help="write sample indexes, DALI .idx files and a manifest for existing WebDataset shards",
        description="Index .tar / .tar.gz shards written by other tools (img2dataset, webdataset) in place.")
    p.add_argument("root", help="directory (local path or fsspec URL) holding the shards")
    p.add_argument("--text", default="auto", help="member holding the caption: txt, json or auto (default)")
    p.add_argument("--json-field", default=None, help="caption field of the .json member (default: caption/text)")
    p.add_argument("--tokenizer", default=None, help="a tokenizers JSON file (default: embedded byte tokenizer)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: CPU count)")
    p.add_argument("--max-image-pixels", type=int, default=DEFAULT_MAX_PIXELS)
    p.add_argument("--max-member-bytes", type=parse_size, default=DEFAULT_MAX_IMAGE_BYTES,
                   help="skip samples with an image or text member larger than this, unread (default 64M)")
    p.add_argument("--storage-options", default=None, help="fsspec storage options as JSON, or @file.json")
    p.add_argument("--rebuild-keys", action="store_true",
                   help="only (re)build the dataset's key index keys.lmdb from its shard indices (any vlmdata "
                        "dataset; the shards are not read)")
    add_max_skip_fraction(p, "samples")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        so = parse_storage_options(args.storage_options)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.rebuild_keys:
        return _rebuild_keys(args.root, so)
    cfg = IndexConfig(root=args.root, text=args.text, json_field=args.json_field, tokenizer=args.tokenizer,
                      workers=args.workers, max_image_pixels=args.max_image_pixels, storage_options=so,
                      max_member_bytes=args.max_member_bytes, max_skip_fraction=args.max_skip_fraction)

    def report(manifest, dt: float) -> None:
        st = manifest.stats
        print(f"indexed {st['shards_found']} shards ({manifest.total_bytes / 1e6:.1f} MB): {st['samples']} "
              f"samples, {st['images']} images in {dt:.1f}s ({manifest.total_bytes / 1e6 / max(dt, 1e-9):.0f} "
              f"MB/s); skipped {skipped_summary(st)}; text from .{manifest.layout['text']}")
        print_lengths(manifest)

    return run_reported(lambda update: index_dataset(cfg, progress=update), report)


def _rebuild_keys(root: str, so: dict) -> int:
    try:
        stats, dt = run_with_progress(lambda update: rebuild_keys(root, so, progress=update))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if stats is None:
        return 2
    dups = f"; {stats['duplicates']} duplicate keys (e.g. {', '.join(stats['duplicate_examples'])})" \
        if stats["duplicates"] else ""
    print(f"wrote {root.rstrip('/')}/keys.lmdb: {stats['entries']} keys in {dt:.1f}s "
          f"({stats['entries'] / max(dt, 1e-9):,.0f} keys/s){dups}")
    return 0
