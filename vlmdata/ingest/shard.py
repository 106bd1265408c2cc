"""`shard_dataset(ShardConfig) -> Manifest`: raw inputs to indexed shards, resumable.

Flow: the inputs are read as one row stream (bounded memory); the stream is
cut into jobs of `max_samples_per_shard` rows, and each job's rows get their
source ids and duplicate flags (first occurrence of a key in the run wins;
later ones are skipped as "duplicate_key"; keys already in a `dedup_against`
dataset as "duplicate_in_dataset"; keyindex.dedup: a log-structured key set
on disk, bounded memory); an engine runs the jobs with a bounded number in flight; finally
the shard indices are streamed into `planning.npz` and `keys.lmdb`
(ingest.finalize) and the per-job stats merged into `manifest.json`.
With `resume`, jobs whose stats file exists and whose shards have the
recorded sizes are not run again (their rows are still streamed, for the
duplicate check and the job numbering).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import asdict, dataclass, field, replace

from fsspec.core import url_to_fs

from vlmdata import fsutil
from vlmdata.errors import ConfigError, EmptyDatasetError, Skip
from vlmdata.formats.manifest import MANIFEST_NAME, Manifest
from vlmdata.formats.sample import safe_key
from vlmdata.ingest.access import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_REMOTE_TIMEOUT, AccessPolicy
from vlmdata.ingest.engine import ENGINES, run_jobs
from vlmdata.ingest.finalize import write_dataset_tables
from vlmdata.ingest.hf_datasets import dataset_inputs
from vlmdata.ingest.images import DEFAULT_MAX_PIXELS, VERIFY_MODES, ImageOptions
from vlmdata.ingest.job import (
    JOBS_DIR,
    JobOptions,
    JobSpec,
    JobStats,
    job_stats_name,
    merge_skips,
)
from vlmdata.ingest.lengths import LengthCounter, dataset_policy, dataset_video_policy
from vlmdata.ingest.readers import InputSource, Row, describe_input, format_names, iter_rows, open_inputs
from vlmdata.ingest.records import ColumnSpec, id_columns, row_id
from vlmdata.ingest.skips import SkipSummary, check_skip_fraction, check_skips
from vlmdata.ingest.video import DEFAULT_MAX_VIDEO_BYTES, VideoOptions
from vlmdata.keyindex.build import open_dataset_keys
from vlmdata.keyindex.dedup import IN_RUN, RunDedup
from vlmdata.text.encoder import load_text_encoder
from vlmdata.text.model_folder import is_model_folder
from vlmdata.video.probe import ClipLimits
from vlmdata.video.transcode import (
    DEFAULT_TRANSCODE_SECONDS,
    TRANSCODE_OFF,
    TranscodeSettings,
    parse_transcode,
)

log = logging.getLogger(__name__)
# the --verify of a run started before the gate followed the decoders, as today's mode: "header" checked headers
# and end markers ("none" comes closest), "decode" was the strict full decode
LEGACY_VERIFY = {"header": "none", "decode": "strict"}
FORMATS = ("wds", "memmap")


@dataclass
class ShardConfig:
    """Options of `vlmdata shard` (see `vlmdata shard --help`)."""

    inputs: list                      # paths / URLs, or datasets.Dataset / IterableDataset objects
    output: str
    input_format: str | None = None
    format: str = "wds"
    image_size: int | None = None
    max_samples_per_shard: int = 1000
    max_shard_bytes: int = 1 << 30
    workers: int | None = None
    engine: str = "local"
    resume: bool = False
    tokenizer: str | None = None
    resize_max_side: int | None = None
    quality: int | None = None
    max_image_pixels: int = DEFAULT_MAX_PIXELS
    columns: ColumnSpec = field(default_factory=ColumnSpec)
    storage_options: dict = field(default_factory=dict)
    fsync: bool = True
    train_on: str = "assistant"       # model folders: "assistant" | "last" | "all" (see text.families.base)
    family: str | None = None         # model folders: force a model family by name
    view: str | None = None           # model folders: the name of the text view written (default: folder name)
    image_root: str | None = None                # references resolve (and must stay) under it; default the input's dir
    allow_remote: bool = False                   # read http(s)/s3/... image URLs named by rows
    allow_hosts: tuple[str, ...] = ()            # with allow_remote: only these hosts / buckets
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    remote_timeout: float = DEFAULT_REMOTE_TIMEOUT
    verify: str | None = None                    # the shard gate's image check (ingest.images: structure/decode/
    #                                              strict/none); None: a resumed run's first mode, else structure
    dedup_against: list[str] = field(default_factory=list)   # datasets whose keys are skipped as duplicates
    max_skip_fraction: float = 1.0               # TooManySkipsError above it, after writing (1: never)
    max_video_bytes: int = DEFAULT_MAX_VIDEO_BYTES               # larger clips: file_too_large, never read past it
    max_video_seconds: float = ClipLimits.max_duration_s         # longer clips: video_too_long
    max_video_pixels: int = ClipLimits.max_frame_pixels          # larger frames: video_too_large (from the header)
    max_video_frames: int = ClipLimits.max_frames                # more frames: video_too_long
    max_probe_seconds: float = ClipLimits.max_probe_s            # a probe taking longer: bad_video
    video_transcode: str | None = None           # "SIDE:FPS" re-encodes each clip (video.transcode), "off" keeps
    #                                              clips as they are; None: a resumed run's first setting, else off
    max_transcode_seconds: float | None = None   # a transcode taking longer: transcode_failed; None: a resumed
    #                                              run's first limit, else DEFAULT_TRANSCODE_SECONDS

    def videos(self) -> VideoOptions:
        """What a clip may be in this run (see ingest.video)."""
        limits = ClipLimits(max_duration_s=float(self.max_video_seconds), max_frame_pixels=int(self.max_video_pixels),
                            max_frames=int(self.max_video_frames), max_probe_s=float(self.max_probe_seconds))
        return VideoOptions(max_bytes=int(self.max_video_bytes), limits=limits,
                            transcode=parse_transcode(self.video_transcode, self.transcode_seconds))

    @property
    def transcode_seconds(self) -> float:
        """`max_transcode_seconds`, the default when not given."""
        return DEFAULT_TRANSCODE_SECONDS if self.max_transcode_seconds is None else float(self.max_transcode_seconds)

    def access(self) -> AccessPolicy:
        """The data-access policy of this run (see ingest.access)."""
        root = self.image_root
        if root is not None and fsutil.is_local(root):
            root = os.path.abspath(fsutil.local_path(root))   # workers may not share the caller's directory
        return AccessPolicy(image_root=root, allow_remote=self.allow_remote,
                            allow_hosts=tuple(self.allow_hosts), max_bytes=self.max_image_bytes,
                            timeout=self.remote_timeout)


SEEN_KEYS = "seen-keys"


def view_name(spec: str | None, name: str | None) -> str:
    """The name of the text view a --tokenizer writes: `name`, else the model folder's name, else "default"."""
    if name:
        return name
    if is_model_folder(spec):
        return os.path.basename(os.path.abspath(spec).rstrip("/")) or "model"
    return "default"


def _check_config(cfg: ShardConfig) -> None:
    if cfg.format not in FORMATS:
        raise ConfigError(f"unknown output format {cfg.format!r}; use --format wds or --format memmap")
    if cfg.format == "memmap" and not (cfg.image_size and cfg.image_size > 0):
        raise ConfigError("--format memmap needs --image-size S (images are stored resized to S x S)")
    if cfg.engine not in ENGINES:
        raise ConfigError(f"unknown engine {cfg.engine!r}; use one of {', '.join(ENGINES)}")
    if cfg.max_samples_per_shard < 1:
        raise ConfigError("--max-samples-per-shard must be >= 1")
    if cfg.max_shard_bytes < 1 << 16:
        raise ConfigError("--max-shard-bytes must be at least 65536")
    if cfg.quality is not None and not 1 <= cfg.quality <= 100:
        raise ConfigError("--quality must be between 1 and 100")
    if cfg.resize_max_side is not None and cfg.resize_max_side < 1:
        raise ConfigError("--resize-max-side must be >= 1")
    if cfg.workers is not None and cfg.workers < 0:
        raise ConfigError("--workers must be >= 0")
    if cfg.verify is not None and cfg.verify not in VERIFY_MODES:
        raise ConfigError(f"unknown --verify {cfg.verify!r}; use one of {', '.join(VERIFY_MODES)}")
    check_skip_fraction(cfg.max_skip_fraction)
    for flag, value in (("--max-video-bytes", cfg.max_video_bytes), ("--max-video-seconds", cfg.max_video_seconds),
                        ("--max-video-pixels", cfg.max_video_pixels), ("--max-video-frames", cfg.max_video_frames),
                        ("--max-probe-seconds", cfg.max_probe_seconds)):
        if not value > 0:
            raise ConfigError(f"{flag} must be > 0, got {value}")
    parse_transcode(cfg.video_transcode, cfg.transcode_seconds)     # ConfigError for a bad spec
    cfg.access().check()


def _probe_output(output: str, storage_options: dict) -> None:
    """Fail now, with a clear message, if the output cannot be written."""
    probe = fsutil.join(output, JOBS_DIR, ".write-probe")
    try:
        fsutil.atomic_write_bytes(probe, b"ok", storage_options, fsync=False)
        fs, path = url_to_fs(probe, **storage_options)
        fs.rm(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot write to output {output}: {exc}; choose a writable --output") from exc


def _fingerprint(cfg: ShardConfig, sources: list[InputSource], tokenizer: dict) -> dict:
    return json.loads(json.dumps(_settings(cfg, sources, tokenizer)))   # as it reads back from config.json


def _settings(cfg: ShardConfig, sources: list[InputSource], tokenizer: dict) -> dict:
    settings = {"inputs": [asdict(s) for s in sources], "format": cfg.format, "image_size": cfg.image_size,
                "max_samples_per_shard": cfg.max_samples_per_shard, "max_shard_bytes": cfg.max_shard_bytes,
                "tokenizer": tokenizer, "resize_max_side": cfg.resize_max_side, "quality": cfg.quality,
                "max_image_pixels": cfg.max_image_pixels, "columns": asdict(cfg.columns), "train_on": cfg.train_on,
                "access": asdict(cfg.access()), "image_check": cfg.verify}
    if cfg.videos() != VideoOptions():           # runs with the default limits keep their settings as before
        settings["video"] = asdict(cfg.videos())
    if cfg.dedup_against:
        settings["dedup_against"] = list(cfg.dedup_against)
    return settings


def _open_dedup(cfg: ShardConfig) -> RunDedup:
    """The run's key set (files in _jobs/ for a local output, else in the temp dir; a resumed run rebuilds
    it from the start of the stream, reaching the same decisions) and the key indices of the
    `dedup_against` datasets; ConfigError if one of those has no usable key index."""
    against = []
    for root in cfg.dedup_against:
        try:
            against.append((root, open_dataset_keys(root, None, cfg.storage_options)))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--dedup-against {root}: {exc}") from exc
    if fsutil.is_local(cfg.output):
        path = os.path.join(fsutil.local_path(cfg.output), JOBS_DIR, SEEN_KEYS)
    else:
        digest = hashlib.sha1(cfg.output.encode()).hexdigest()[:16]
        path = os.path.join(tempfile.gettempdir(), f"vlmdata-seen-keys-{digest}")
    return RunDedup(path, against)


def _first_run_settings(cfg: ShardConfig) -> dict | None:
    """The settings stored by the run `cfg.output` holds (with the defaults of settings added since), or None."""
    config_url = fsutil.join(cfg.output, JOBS_DIR, "config.json")
    if not fsutil.exists(config_url, cfg.storage_options):
        return None
    old = json.loads(fsutil.read_bytes(config_url, cfg.storage_options))
    # runs started before these settings existed used their defaults
    old = {"access": json.loads(json.dumps(asdict(AccessPolicy()))), "train_on": "assistant", **old}
    if "image_check" not in old:   # stored as "verify" before the gate followed the decoders
        old["image_check"] = LEGACY_VERIFY.get(old.pop("verify", "header"), "?")
    if "video" in old:             # runs started before --video-transcode kept their clips as they are
        old["video"] = {"transcode": None, **old["video"]}
    return old


def _image_check(cfg: ShardConfig) -> str:
    """`--verify` as given; not given: the first run's mode when resuming one, else the default (structure)."""
    if cfg.verify is not None:
        return cfg.verify
    old = _first_run_settings(cfg) if cfg.resume else None
    return old["image_check"] if old and old["image_check"] in VERIFY_MODES else VERIFY_MODES[0]


def _video_transcode(cfg: ShardConfig) -> ShardConfig:
    """`--video-transcode` and `--max-transcode-seconds` as given; one not given: the first run's when resuming
    a run that transcoded, else off / the default limit. A resumed run given another limit than its first
    run's is refused: the limit decides which clips are skipped as transcode_failed, so one run keeps one."""
    old = _first_run_settings(cfg) if cfg.resume else None
    stored = ((old or {}).get("video") or {}).get("transcode")
    first = TranscodeSettings(**stored) if stored else None
    if first is not None and cfg.max_transcode_seconds is not None and cfg.transcode_seconds != first.max_seconds:
        raise ConfigError(f"--resume with --max-transcode-seconds {cfg.transcode_seconds:g}, but the first run "
                          f"used {first.max_seconds:g}: the limit decides which clips are skipped as "
                          f"transcode_failed, so a run keeps its first one; leave the option out (or pass "
                          f"{first.max_seconds:g}), or use an empty output")
    spec = cfg.video_transcode if cfg.video_transcode is not None else first.spec if first else TRANSCODE_OFF
    seconds = first.max_seconds if first is not None and cfg.max_transcode_seconds is None else cfg.transcode_seconds
    return replace(cfg, video_transcode=spec, max_transcode_seconds=seconds)


def _prepare_output(cfg: ShardConfig, fingerprint: dict) -> None:
    so = cfg.storage_options
    config_url = fsutil.join(cfg.output, JOBS_DIR, "config.json")
    has_dataset = fsutil.exists(config_url, so) or fsutil.exists(fsutil.join(cfg.output, MANIFEST_NAME), so)
    if has_dataset and not cfg.resume:
        raise ConfigError(f"{cfg.output} already holds a dataset; pass --resume to continue it or use an empty output")
    old = _first_run_settings(cfg) if has_dataset else None
    if old is not None:
        fingerprint = json.loads(json.dumps(fingerprint))    # compared as stored (tuples are lists in JSON)
        if old != fingerprint:
            changed = sorted(k for k in {*fingerprint, *old} if old.get(k) != fingerprint.get(k))
            raise ConfigError(f"--resume with different settings than the first run ({', '.join(changed)}); "
                              "use the same options or an empty output")
    _probe_output(cfg.output, so)
    _remove_stale_temps(cfg.output)
    fsutil.atomic_write_bytes(config_url, json.dumps(fingerprint, sort_keys=True, indent=1).encode(), so, cfg.fsync)


def _remove_stale_temps(output: str) -> None:
    """Drop temporary files a killed run left behind (local outputs only)."""
    if not fsutil.is_local(output):
        return
    root = fsutil.local_path(output)
    for d in (root, os.path.join(root, JOBS_DIR)):
        if os.path.isdir(d):
            for name in os.listdir(d):
                if name.startswith(".tmp-"):
                    os.unlink(os.path.join(d, name))


def _job_is_done(output: str, job: int, so: dict) -> JobStats | None:
    url = fsutil.join(output, job_stats_name(job))
    try:
        stats = JobStats.from_json(fsutil.read_bytes(url, so))
    except FileNotFoundError:
        return None
    fs, _ = url_to_fs(output, **so)
    for s in stats.shard_infos():
        for name, size in [(s.name, s.bytes), (s.index, None)] + ([(s.dali_index, None)] if s.dali_index else []):
            _, path = url_to_fs(fsutil.join(output, name), **so)
            if not fs.exists(path) or (size is not None and fs.size(path) != size):
                return None
    return stats


class _JobStream:
    """Cuts the row stream into JobSpecs, assigning ids and duplicate flags on the way."""

    def __init__(self, cfg: ShardConfig, sources: list[InputSource], on_resumed: Callable[[dict], None],
                 dedup: RunDedup, given: dict | None = None):
        self.cfg = cfg
        self.sources = sources
        self.given = given             # rows of inputs not read from their URL (ingest.hf_datasets)
        self.on_resumed = on_resumed
        self.dedup = dedup
        self.jobs = 0
        self.rows = 0                  # rows streamed so far: a row's number in the run

    def _name(self, row: Row) -> Row:
        if row.data is None:
            row.id = f"{os.path.basename(self.sources[row.source].url.rstrip('/'))}:{row.number}"
            return row
        fallback = f"{os.path.splitext(os.path.basename(self.sources[row.source].url.rstrip('/')))[0]}-{row.number:09d}"
        if len(self.sources) > 1:
            fallback = f"i{row.source}-{fallback}"
        row.id = row_id(row.data, self.cfg.columns, fallback)
        return row

    def _mark(self, rows: list[Row], first: int) -> None:
        """Duplicate flags for a job's rows (rows first .. first + len - 1 of the run)."""
        keyed = [(r, first + i) for i, r in enumerate(rows) if r.data is not None]
        marks = self.dedup.mark([safe_key(r.id) for r, _ in keyed], [n for _, n in keyed])
        for (r, _), mark in zip(keyed, marks):
            if mark == IN_RUN:
                r.duplicate = True
            elif mark is not None:
                r.duplicate_in = mark

    def __iter__(self) -> Iterator[JobSpec]:
        n = self.cfg.max_samples_per_shard
        batch: list[Row] = []
        for row in iter_rows(self.sources, self.cfg.storage_options, self.given):
            batch.append(self._name(row))
            if len(batch) == n:
                yield from self._emit(batch)
                batch = []
        if batch:
            yield from self._emit(batch)

    def _emit(self, rows: list[Row]) -> Iterator[JobSpec]:
        self._mark(rows, self.rows)
        self.rows += len(rows)
        job = self.jobs
        self.jobs += 1
        if self.cfg.resume:
            done = _job_is_done(self.cfg.output, job, self.cfg.storage_options)
            if done is not None and done.rows == len(rows):
                self.on_resumed(asdict(done))
                return
        yield JobSpec(job=job, rows=rows)


def _empty_error(cfg: ShardConfig, sources: list[InputSource], results: list[dict]) -> EmptyDatasetError:
    """What was found and what to pass instead, for a run that would write 0 samples."""
    found = "; ".join(describe_input(s, cfg.storage_options) for s in sources)
    rows = sum(r["rows"] for r in results)
    hint = (f"pass the table file itself (JSON array, JSONL, CSV, TSV, Parquet) or a directory holding one, "
            f"or set --input-format (one of {format_names()})")
    if rows == 0:
        return EmptyDatasetError(f"found 0 input rows in {found}; {hint}")
    skipped: dict[str, int] = {}
    example = None
    for r in sorted(results, key=lambda r: r["job"]):
        for reason, count in r["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + count
            example = example or (reason, r["examples"][reason])
    reasons = ", ".join(f"{k}={v}" for k, v in sorted(skipped.items(), key=lambda kv: -kv[1]))
    msg = f"all {rows} input rows were skipped ({reasons}) in {found}"
    if example is not None:
        msg += f"; e.g. row {example[1]['row']} ({example[0]}): {example[1]['detail']}"
    if set(skipped) <= {Skip.DUPLICATE_KEY, Skip.DUPLICATE_IN_DATASET}:
        return EmptyDatasetError(f"{msg}; every row is a duplicate: nothing new to shard")
    if Skip.MISSING_TEXT in skipped and any(s.format == "folder" for s in sources):
        msg += "; an image folder needs a .txt caption beside each image"
    elif Skip.OUTSIDE_ROOT in skipped or Skip.REMOTE_NOT_ALLOWED in skipped:
        msg += ("; rows may only read images under the input's directory: pass --image-root DIR for images "
                "elsewhere, --allow-remote (and --allow-host HOST) for URLs")
    elif Skip.VIDEO_UNSUPPORTED in skipped:
        msg += ("; rows with videos are probed and counted, but written only for a model family with a video "
                "policy (see docs/video.md)")
    elif any(k in skipped for k in (Skip.BAD_TEXT, Skip.MISSING_IMAGE_REF)):
        msg += "; check the table's columns (--image-column / --text-column) or its layout (LLaVA rows need " \
               "'conversations')"
    return EmptyDatasetError(f"{msg}; {hint}")


def _remove_run_state(output: str, so: dict) -> None:
    """Drop `_jobs/` of a run that wrote nothing, so the next try needs no --resume."""
    fs, path = url_to_fs(fsutil.join(output, JOBS_DIR), **so)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def _merge(cfg: ShardConfig, results: list[dict], tokenizer: dict, extra_stats: dict) -> Manifest:
    manifest = _build_manifest(cfg, results, tokenizer, extra_stats)
    if tokenizer.get("name") == "model-folder":
        name = view_name(cfg.tokenizer, cfg.view)
        manifest.views = {name: {"tokenizer": tokenizer, "tokens": "tar", "train_on": cfg.train_on,
                                 "samples": manifest.stats["samples"], "created": extra_stats.get("created")}}
        manifest.default_view = name
    # how the rows were read: retokenize reads each sample's stored row (.json member) the same way
    manifest.stats["columns"] = {"image": cfg.columns.image, "text": cfg.columns.text, "id": cfg.columns.id}
    manifest.save(cfg.output, cfg.storage_options)
    return manifest


def _video_count(results: list[dict]) -> dict:
    """{"videos": clips written} when the run wrote any (image-only runs keep their stats as before)."""
    n = sum(r.get("videos", 0) for r in results)
    return {"videos": n} if n else {}


def _transcode_stats(cfg: ShardConfig) -> dict:
    """{"video_transcode": its settings} for a run that re-encoded its clips (other runs' stats as before)."""
    settings = cfg.videos().transcode
    return {"video_transcode": asdict(settings)} if settings is not None else {}


def _build_manifest(cfg: ShardConfig, results: list[dict], tokenizer: dict, extra_stats: dict) -> Manifest:
    so = cfg.storage_options
    results.sort(key=lambda r: r["job"])
    shards = [s for r in results for s in JobStats(**r).shard_infos()]
    skipped, examples = merge_skips(results, tag="job")
    stats = {"input_rows": sum(r["rows"] for r in results), "samples": sum(r["written"] for r in results),
             "images": sum(r["images"] for r in results), **_video_count(results), **_transcode_stats(cfg),
             "skipped": dict(sorted(skipped.items())),
             "skipped_total": sum(skipped.values()), "examples": examples, "jobs": len(results), **extra_stats}
    if cfg.format == "memmap":
        s = cfg.image_size
        patch = next(p for p in (14, 16, s) if s % p == 0)
        policy = {"kind": "fixed", "size": s, "patch": patch, "merge": 1}
        manifest = Manifest(kind="memmap", shards=shards, tokenizer=tokenizer, image_policy=policy,
                            layout={"text": "tok.npy", "data": "mm"}, stats=stats)
    else:
        manifest = Manifest(kind="webdataset", shards=shards, tokenizer=tokenizer, stats=stats)
    video = dataset_video_policy(manifest)
    lengths = LengthCounter(dataset_policy(manifest), video_policy=video)
    write_dataset_tables(cfg.output, shards, so, cfg.fsync, on_index=lengths.add_index, video_policy=video)
    manifest.stats["lengths"] = lengths.report(cfg.output, manifest, so).to_stats()
    return manifest


class _Progress:
    """Turns cumulative per-job reports and finished jobs into (rows, written) increments."""

    def __init__(self, callback: Callable[[int, int], None] | None):
        self.callback = callback
        self.seen: dict[int, tuple[int, int]] = {}
        self.finished: set[int] = set()

    def partial(self, job: int, rows: int, written: int) -> None:
        if self.callback is None or job in self.finished:  # a report that arrived after the result
            return
        r0, w0 = self.seen.get(job, (0, 0))
        if rows > r0 or written > w0:
            self.seen[job] = (max(rows, r0), max(written, w0))
            self.callback(max(0, rows - r0), max(0, written - w0))

    def finish(self, job: int, rows: int, written: int) -> None:
        self.finished.add(job)
        r0, w0 = self.seen.pop(job, (0, 0))
        if self.callback is not None and (rows != r0 or written != w0):
            self.callback(rows - r0, written - w0)


def _warn_inexact_storage(cfg: ShardConfig, tokenizer: dict) -> None:
    """Stored pixels that are not the originals cannot give the processor's pixels at load time (issue 21)."""
    if tokenizer.get("name") != "model-folder":
        return
    changes = [f for f, on in (("--format memmap", cfg.format == "memmap"),
                               ("--resize-max-side", cfg.resize_max_side is not None),
                               ("--quality", cfg.quality is not None)) if on]
    if changes:
        log.warning("%s stores images resized or re-encoded: the loader's pixels will be close to the %s "
                    "processor's but not equal (keep the originals for exact pixels)",
                    " and ".join(changes), tokenizer.get("family"))


def shard_dataset(cfg: ShardConfig, progress: Callable[[int, int], None] | None = None,
                  executor: Executor | None = None, progress_interval: float = 0.2) -> Manifest:
    """Shard `cfg.inputs` into `cfg.output`; returns the written manifest.

    `progress(rows, written)` receives increments as jobs advance: with the
    local engine at most every `progress_interval` seconds per job while it
    runs (workers report through a queue), and the rest when a job finishes
    (Ray and a caller-owned pool: per finished job only). The increments
    add up to the run's rows and written samples. `executor` (local engine)
    runs the jobs in a pool the caller owns instead of a new one. Raises ConfigError (before any work) for bad options, missing inputs
    or an unwritable output, and EmptyDatasetError (a ConfigError; after the
    run, leaving no dataset and no resume state) when no row was found or
    every row was skipped. More than `cfg.max_skip_fraction` of the rows
    skipped raises TooManySkipsError after the dataset is written (its
    `result` is the manifest); from 1 % a warning is logged.
    """
    t0 = time.perf_counter()
    _check_config(cfg)
    cfg = _video_transcode(replace(cfg, verify=_image_check(cfg)))
    text = load_text_encoder(cfg.tokenizer, cfg.train_on, cfg.family)
    tokenizer = text.identity()
    _warn_inexact_storage(cfg, tokenizer)
    if cfg.format == "memmap" and tokenizer.get("name") == "model-folder":
        policy = tokenizer["vision"]["policy"]
        if policy["kind"] != "fixed" or policy["size"] != cfg.image_size:
            raise ConfigError(f"--format memmap stores {cfg.image_size}px images, but the {tokenizer['family']} "
                              f"model's image policy is {policy}; use --format wds for this model")
    sources = open_inputs(cfg.inputs, cfg.input_format, cfg.storage_options, cfg.remote_timeout)
    fingerprint = _fingerprint(cfg, sources, tokenizer)
    _prepare_output(cfg, fingerprint)
    dedup = _open_dedup(cfg)
    workers = (os.cpu_count() or 1) if cfg.workers is None else cfg.workers
    given, ranged = dataset_inputs(cfg.inputs, sources, id_columns(cfg.columns), cfg.storage_options)
    opts = JobOptions(output=cfg.output, sources=tuple(sources), format=cfg.format, image_size=cfg.image_size,
                      max_shard_bytes=cfg.max_shard_bytes,
                      images=ImageOptions(cfg.max_image_pixels, cfg.resize_max_side, cfg.quality, cfg.verify),
                      videos=cfg.videos(),
                      tokenizer=cfg.tokenizer, columns=cfg.columns, storage_options=cfg.storage_options,
                      fsync=cfg.fsync, train_on=cfg.train_on, family=cfg.family, access=cfg.access(),
                      datasets=ranged)
    results: list[dict] = []
    resumed = []
    tracker = _Progress(progress)

    def done(r: dict) -> None:
        results.append(r)
        tracker.finish(r["job"], r["rows"], r["written"])

    def resumed_job(r: dict) -> None:
        resumed.append(r["job"])
        done(r)

    stream = _JobStream(cfg, sources, resumed_job, dedup, given)
    try:
        run_jobs(cfg.engine, iter(stream), opts, workers, done, executor,
                 tracker.partial if progress is not None else None, progress_interval)
    finally:
        dedup.remove()                  # a resumed run rebuilds it from the start of the stream
    if sum(r["written"] for r in results) == 0:
        _remove_run_state(cfg.output, cfg.storage_options)
        raise _empty_error(cfg, sources, results)
    seconds = time.perf_counter() - t0
    extra = {"seconds": round(seconds, 3), "engine": cfg.engine, "workers": workers,
             "resumed_jobs": len(resumed), "inputs": [s.url for s in sources],
             "input_formats": [s.format for s in sources],
             **({"dedup_against": list(cfg.dedup_against)} if cfg.dedup_against else {}),
             "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    manifest = _merge(cfg, results, tokenizer, extra)
    log.debug("sharded %d rows in %.1fs", manifest.stats["input_rows"], seconds)
    check_skips(SkipSummary.from_stats(manifest.stats), cfg.max_skip_fraction, manifest)
    return manifest
