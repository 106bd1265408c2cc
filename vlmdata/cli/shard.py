"""`vlmdata shard`: raw image-text data into indexed WebDataset (or memmap) shards."""
from __future__ import annotations

import argparse
import sys

from vlmdata.cli.options import parse_storage_options, run_with_progress, skipped_summary
from vlmdata.ingest.images import DEFAULT_MAX_PIXELS
from vlmdata.ingest.readers import INPUT_FORMAT_ALIASES, INPUT_FORMATS
from vlmdata.ingest.records import ColumnSpec
from vlmdata.ingest.shard import ShardConfig, shard_dataset


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "shard", help="shard raw image-text data (LLaVA JSON/JSONL, caption JSONL/CSV/Parquet, image folders)",
        description="Write WebDataset (or memmap) shards with a sample index, DALI .idx files and a manifest.")
    p.add_argument("inputs", nargs="+", help="input files or folders (local paths or fsspec URLs)")
    p.add_argument("-o", "--output", required=True, help="output dataset directory (local path or fsspec URL)")
    p.add_argument("--input-format", choices=(*INPUT_FORMATS, *INPUT_FORMAT_ALIASES), default=None,
                   help="override format auto-detection (llava/caption: a table file, its format detected; "
                        "a directory holding one table file, e.g. data.jsonl beside images/, is read as that table)")
    p.add_argument("--format", default="wds", help="wds (default) or memmap")
    p.add_argument("--image-size", type=int, default=None, help="memmap: images resized to S x S")
    p.add_argument("--max-samples-per-shard", type=int, default=1000, help="rows per job/shard (default 1000)")
    p.add_argument("--max-shard-bytes", type=int, default=1 << 30, help="start a new shard part above this size")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: CPU count; 0 = inline)")
    p.add_argument("--engine", default="local", help="local (process pool, default) or ray")
    p.add_argument("--resume", action="store_true", help="skip jobs already committed by an earlier run")
    p.add_argument("--tokenizer", default=None, help="a tokenizers JSON file (default: embedded byte tokenizer)")
    p.add_argument("--resize-max-side", type=int, default=None, help="re-encode images larger than this side")
    p.add_argument("--quality", type=int, default=None, help="JPEG quality when re-encoding (default 95)")
    p.add_argument("--max-image-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                   help="skip larger images as decompression bombs")
    p.add_argument("--image-column", default=None, help="caption tables: the image column")
    p.add_argument("--text-column", default=None, help="caption tables: the text column")
    p.add_argument("--id-column", default=None, help="the sample id column (default: id/key, else row number)")
    p.add_argument("--storage-options", default=None, help="fsspec storage options as JSON (e.g. endpoint_url), or @file.json")
    p.add_argument("--no-fsync", action="store_true",
                   help="do not fsync local files before renaming them (faster; a killed run still leaves no "
                        "torn file, a power loss may)")
    p.add_argument("--dedup-against", nargs="+", action="extend", default=[], metavar="DATASET",
                   help="skip rows whose key is already in these datasets (their keys.lmdb), counted as "
                        "duplicate_in_dataset")
    p.add_argument("--progress-interval", type=float, default=0.2,
                   help="seconds between a running job's progress reports to the bar (terminal only)")
    p.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    try:
        storage_options = parse_storage_options(args.storage_options)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cfg = ShardConfig(inputs=args.inputs, output=args.output, input_format=args.input_format, format=args.format,
                      image_size=args.image_size, max_samples_per_shard=args.max_samples_per_shard,
                      max_shard_bytes=args.max_shard_bytes, workers=args.workers, engine=args.engine,
                      resume=args.resume, tokenizer=args.tokenizer, resize_max_side=args.resize_max_side,
                      quality=args.quality, max_image_pixels=args.max_image_pixels,
                      columns=ColumnSpec(image=args.image_column, text=args.text_column, id=args.id_column),
                      storage_options=storage_options, fsync=not args.no_fsync, dedup_against=args.dedup_against)
    interval = max(0.0, args.progress_interval)
    manifest, dt = run_with_progress(lambda update: shard_dataset(cfg, progress=update, progress_interval=interval))
    if manifest is None:
        return 2
    st = manifest.stats
    print(f"sharded {st['input_rows']} rows -> {st['samples']} samples, {st['images']} images in "
          f"{len(manifest.shards)} shards ({manifest.total_bytes / 1e6:.1f} MB) in {dt:.1f}s "
          f"({st['input_rows'] / max(dt, 1e-9):.0f} rows/s); skipped {skipped_summary(st)}; "
          f"resumed jobs {st['resumed_jobs']}; output {args.output}")
    return 0
