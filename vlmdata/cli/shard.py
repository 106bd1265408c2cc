"""`vlmdata shard`: raw image-text data into indexed WebDataset (or memmap) shards."""
from __future__ import annotations

import argparse
import sys

from vlmdata.cli.options import (
    add_max_skip_fraction,
    parse_storage_options,
    print_lengths,
    run_reported,
    skipped_summary,
)
from vlmdata.cli.tune import parse_size
from vlmdata.errors import ConfigError
from vlmdata.ingest.access import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_REMOTE_TIMEOUT
from vlmdata.ingest.images import DEFAULT_MAX_PIXELS, VERIFY_MODES
from vlmdata.ingest.layouts import parse_columns
from vlmdata.ingest.readers import INPUT_FORMAT_ALIASES, INPUT_FORMATS
from vlmdata.ingest.records import ColumnSpec
from vlmdata.ingest.shard import ShardConfig, shard_dataset
from vlmdata.ingest.video import DEFAULT_MAX_VIDEO_BYTES
from vlmdata.text.families.registry import family_names
from vlmdata.video.probe import ClipLimits
from vlmdata.video.transcode import DEFAULT_TRANSCODE_SECONDS


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "shard", help="shard raw image-text data (LLaVA / OpenAI JSON/JSONL, caption JSONL/CSV/Parquet, image "
                      "folders, Hugging Face datasets folders)",
        description="Write WebDataset (or memmap) shards with a sample index, DALI .idx files and a manifest.")
    p.add_argument("inputs", nargs="+",
                   help="input files or folders (local paths or fsspec URLs, hf:// with huggingface_hub), or a "
                        "Hugging Face datasets save_to_disk folder; WebDataset tars: use `vlmdata index`")
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
    p.add_argument("--tokenizer", default=None,
                   help="a Hugging Face model or processor folder (its tokenizer, chat template and image tokens: "
                        "docs/model-families.md lists the families), or a tokenizers JSON file (vlmdata's own layout); "
                        "default: the embedded byte tokenizer")
    p.add_argument("--train-on", choices=("assistant", "last", "all"), default="assistant",
                   help="model folders: train on every assistant reply and its end-of-turn token (default), the "
                        "last reply only, or all tokens")
    p.add_argument("--family", default=None, help=f"model folders: force the model family ({family_names()}; default: from the folder)")
    p.add_argument("--view", default=None, help="model folders: name of the text view (default: the folder's name)")
    p.add_argument("--columns", default=None,
                   help="rename a table's columns to the names vlmdata reads, e.g. messages=chat,images=pictures "
                        "(names: id, messages, conversations, system, images, image, texts, text, caption, "
                        "text_list, image_info)")
    p.add_argument("--resize-max-side", type=int, default=None, help="re-encode images larger than this side")
    p.add_argument("--quality", type=int, default=None, help="JPEG quality when re-encoding (default 95)")
    p.add_argument("--max-image-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                   help="skip larger images as decompression bombs")
    p.add_argument("--max-image-bytes", type=parse_size, default=DEFAULT_MAX_IMAGE_BYTES,
                   help="skip image (and caption) files larger than this, e.g. 64M (default 64M); "
                        "never read past it")
    p.add_argument("--verify", choices=VERIFY_MODES, default=None,
                   help="structure (default): keep a JPEG/PNG whose structure is clean without decoding it, decode "
                        "every other file and every odd one with the loader's decoder (see docs/shard-gate.md); "
                        "decode: decode every image as the loader would (JPEGs at 1/8 scale); strict: also refuse "
                        "JPEGs libjpeg warns about; none: header checks only (bad bodies are left for the loader "
                        "to count); a resumed run keeps its first run's mode unless one is given")
    p.add_argument("--max-video-bytes", type=parse_size, default=DEFAULT_MAX_VIDEO_BYTES,
                   help="skip video clips larger than this, e.g. 512M (default 1G); never read past it")
    p.add_argument("--max-video-seconds", type=float, default=ClipLimits.max_duration_s,
                   help=f"skip longer clips (declared or measured) as video_too_long (default "
                        f"{ClipLimits.max_duration_s:g})")
    p.add_argument("--max-video-pixels", type=int, default=ClipLimits.max_frame_pixels,
                   help="skip clips with larger frames as video_too_large, read from the header (default 8192^2)")
    p.add_argument("--max-video-frames", type=int, default=ClipLimits.max_frames,
                   help=f"skip clips with more frames as video_too_long (default {ClipLimits.max_frames})")
    p.add_argument("--max-probe-seconds", type=float, default=ClipLimits.max_probe_s,
                   help=f"skip a clip whose probe takes longer as bad_video (default {ClipLimits.max_probe_s:g})")
    p.add_argument("--video-transcode", default=None, metavar="SIDE:FPS",
                   help="re-encode each clip (H.264 mp4) upright, its longer side at most SIDE pixels, at most FPS "
                        "frames per second, a keyframe every second, no audio, e.g. 448:2 (see docs/video.md); "
                        "off (default): keep clips as they are; a resumed run keeps its first run's setting "
                        "unless one is given")
    p.add_argument("--max-transcode-seconds", type=float, default=None,
                   help=f"skip a clip whose transcode takes longer as transcode_failed (default "
                        f"{DEFAULT_TRANSCODE_SECONDS:g}); a resumed run keeps its first run's limit and refuses "
                        "another")
    p.add_argument("--image-root", default=None,
                   help="directory relative image references resolve against; rows may only read files under it "
                        "(default: each input's own directory)")
    p.add_argument("--allow-remote", action="store_true",
                   help="let rows name remote image URLs (http, https, s3, gs, ...); off by default")
    p.add_argument("--allow-host", action="append", default=[], metavar="HOST",
                   help="with --allow-remote: read remote images only from HOST (host name or bucket; repeat or "
                        "comma-separate for several)")
    p.add_argument("--remote-timeout", type=float, default=DEFAULT_REMOTE_TIMEOUT,
                   help=f"seconds one remote image read may take (default {DEFAULT_REMOTE_TIMEOUT:g})")
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
    add_max_skip_fraction(p, "input rows")
    p.set_defaults(func=run)

def run(args: argparse.Namespace) -> int:
    try:
        storage_options = parse_storage_options(args.storage_options)
        mapping = parse_columns(args.columns)
    except (OSError, ValueError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cfg = ShardConfig(inputs=args.inputs, output=args.output, input_format=args.input_format, format=args.format,
                      image_size=args.image_size, max_samples_per_shard=args.max_samples_per_shard,
                      max_shard_bytes=args.max_shard_bytes, workers=args.workers, engine=args.engine,
                      resume=args.resume, tokenizer=args.tokenizer, resize_max_side=args.resize_max_side,
                      quality=args.quality, max_image_pixels=args.max_image_pixels,
                      columns=ColumnSpec(image=args.image_column, text=args.text_column, id=args.id_column,
                                         mapping=mapping),
                      storage_options=storage_options, fsync=not args.no_fsync, train_on=args.train_on,
                      family=args.family, view=args.view, image_root=args.image_root,
                      allow_remote=args.allow_remote,
                      allow_hosts=tuple(h.strip() for arg in args.allow_host for h in arg.split(",") if h.strip()),
                      max_image_bytes=args.max_image_bytes, remote_timeout=args.remote_timeout, verify=args.verify,
                      dedup_against=args.dedup_against, max_skip_fraction=args.max_skip_fraction,
                      max_video_bytes=args.max_video_bytes, max_video_seconds=args.max_video_seconds,
                      max_video_pixels=args.max_video_pixels, max_video_frames=args.max_video_frames,
                      max_probe_seconds=args.max_probe_seconds, video_transcode=args.video_transcode,
                      max_transcode_seconds=args.max_transcode_seconds)
    interval = max(0.0, args.progress_interval)

    def report(manifest, dt: float) -> None:
        st = manifest.stats
        print(f"sharded {st['input_rows']} rows -> {st['samples']} samples, {st['images']} images in "
              f"{len(manifest.shards)} shards ({manifest.total_bytes / 1e6:.1f} MB) in {dt:.1f}s "
              f"({st['input_rows'] / max(dt, 1e-9):.0f} rows/s); skipped {skipped_summary(st)}; "
              f"resumed jobs {st['resumed_jobs']}; output {args.output}")
        print_lengths(manifest)

    return run_reported(lambda update: shard_dataset(cfg, progress=update, progress_interval=interval), report)
