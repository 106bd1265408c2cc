"""One sharding job: a fixed slice of input rows in, committed shard part(s) and a stats file out.

A job is idempotent and deterministic: job i always holds rows
[i*n, (i+1)*n) of the input stream and writes `shard-{i:06d}-{part:02d}.*`
(a new part when `max_shard_bytes` would be exceeded), then
`_jobs/job-{i:06d}.json` LAST: the durable "done" marker `--resume` trusts.
Every row ends up either written or skipped with a reason
(rows == written + sum(skipped)): no exception raised while turning one row
into a sample ends the job (an unexpected type is counted as `bad_row` and
logged once per type). Image and clip references are read through `ingest.access`
(the data-access policy and bounded reads); clips are probed and kept as they are
(`ingest.video`), and written only for a text encoder that lays out videos.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from vlmdata import fsutil
from vlmdata.errors import RowProblem, Skip, SkipError
from vlmdata.formats.manifest import ShardInfo
from vlmdata.formats.memmap import MemmapPartWriter
from vlmdata.formats.sample import EncodedImage, safe_key
from vlmdata.formats.shard_writer import WdsPartWriter, sample_bytes_estimate
from vlmdata.ingest.access import AccessPolicy, read_ref
from vlmdata.ingest.data_url import decode_data_url, elide_data_urls, is_data_url
from vlmdata.ingest.frame_list import prepare_frame_list
from vlmdata.ingest.hf_datasets import RangedDataset, fill_rows
from vlmdata.ingest.images import (
    MAX_IMAGES_PER_SAMPLE,
    ImageOptions,
    check_image,
    decode_resized,
    prepare_image,
)
from vlmdata.ingest.readers import InputSource, Row
from vlmdata.ingest.records import ColumnSpec, check_text, normalize
from vlmdata.ingest.video import (
    FrameList,
    VideoOptions,
    encodes_video,
    prepare_video,
    require_video_policy,
)
from vlmdata.text.chat_template import TemplateError
from vlmdata.text.encoder import load_text_encoder

log = logging.getLogger(__name__)
JOBS_DIR = "_jobs"


def merge_skips(results: list[dict], tag: str | None = None) -> tuple[dict[str, int], dict[str, dict]]:
    """Skip counts summed over per-job (or per-shard) results, and the first example of each reason
    (carrying the result's `tag` field, e.g. its job number, when given)."""
    skipped: dict[str, int] = {}
    examples: dict[str, dict] = {}
    for r in results:
        for reason, count in r["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + count
            if reason not in examples:
                examples[reason] = {**r["examples"][reason], **({tag: r[tag]} if tag else {})}
    return skipped, examples


def job_stats_name(job: int) -> str:
    return f"{JOBS_DIR}/job-{job:06d}.json"


def output_shard_stem(job: int, part: int) -> str:
    """The file stem of part `part` of shard job `job` (shard-JJJJJJ-PP)."""
    return f"shard-{job:06d}-{part:02d}"


@dataclass(frozen=True)
class JobOptions:
    """Everything a job needs besides its rows (picklable, shared by all jobs of a run)."""

    output: str
    sources: tuple[InputSource, ...]
    format: str = "wds"                      # "wds" | "memmap"
    image_size: int | None = None            # memmap only
    max_shard_bytes: int = 1 << 30
    images: ImageOptions = ImageOptions()
    videos: VideoOptions = VideoOptions()
    tokenizer: str | None = None             # None / "bytes", a tokenizers JSON file, or a model folder
    columns: ColumnSpec = ColumnSpec()
    train_on: str = "assistant"              # model folders: "assistant" | "last" | "all"
    family: str | None = None                # model folders: force a model family by name
    storage_options: dict = field(default_factory=dict)
    fsync: bool = True                       # fsync each file before its rename (power-loss safe)
    access: AccessPolicy = AccessPolicy()    # what rows may read, and the read bounds
    datasets: tuple[RangedDataset, ...] = ()  # inputs whose rows the job reads by index (ingest.hf_datasets)


@dataclass
class JobSpec:
    job: int
    rows: list[Row]


@dataclass
class JobStats:
    """What a job did; also its on-disk done marker."""

    job: int
    rows: int = 0
    written: int = 0
    images: int = 0
    videos: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, dict] = field(default_factory=dict)
    shards: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def skip(self, reason: str, row: Row, detail: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if reason not in self.examples:
            self.examples[reason] = {"source": row.source, "row": row.number, "id": row.id, "detail": detail[:300]}

    def shard_infos(self) -> list[ShardInfo]:
        return [ShardInfo(**s) for s in self.shards]

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> JobStats:
        return cls(**json.loads(data))


def _serialisable(meta: dict) -> None:
    try:
        json.dumps(meta, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError) as exc:
        raise RowProblem(Skip.BAD_ROW, f"record cannot be written as JSON: {type(exc).__name__}") from None


class _Sampler:
    """Turns rows into ready-to-write samples (validation, images, tokens)."""

    def __init__(self, opts: JobOptions, text):
        self.opts = opts
        self.text = text  # a text.encoder (BuiltinEncoder or a ModelFamily)
        # clips of rows the encoder cannot write (video_unsupported) are probed, never transcoded
        self.videos = opts.videos if encodes_video(text) else replace(opts.videos, transcode=None)

    def build(self, row: Row) -> tuple[str, dict, np.ndarray, list, list[tuple[int, int]], list]:
        if row.error is not None:
            raise RowProblem(Skip.BAD_ROW, row.error)
        if row.duplicate:
            raise RowProblem(Skip.DUPLICATE_KEY, f"id {row.id!r} seen earlier in this run")
        if row.duplicate_in:
            raise RowProblem(Skip.DUPLICATE_IN_DATASET, f"id {row.id!r} is already in {row.duplicate_in}")
        opts = self.opts
        source = opts.sources[row.source]
        root = opts.access.root_for(source.base, source.format == "folder")
        sample = normalize(row.data, row.id, opts.columns, native=source.format in ("json", "jsonl"))
        if len(sample.images) > MAX_IMAGES_PER_SAMPLE:
            raise RowProblem(Skip.TOO_MANY_IMAGES, f"{len(sample.images)} images > {MAX_IMAGES_PER_SAMPLE} per sample")
        if sample.extra.get("folder"):
            sample.turns = [("user", ""), ("assistant", self._sidecar(sample, root))]
            sample.meta["caption"] = sample.turns[1][1]
        check_text(sample)
        if any(is_data_url(ref) for ref in sample.images + sample.videos):   # no second copy in the record
            sample.meta = elide_data_urls(sample.meta)
        if opts.format == "memmap":   # the memmap writer serialises the record after writing the images
            _serialisable(sample.meta)
        images, sizes = [], []
        for ref in sample.images:
            data = read_ref(ref, root, opts.access, opts.storage_options)
            if opts.format == "memmap":   # decoded whole below: the header checks suffice ("strict" adds its own)
                verify = "strict" if opts.images.verify == "strict" else "none"
                _, w, h = check_image(data, opts.images.max_pixels, verify)
                s = opts.image_size
                images.append(np.asarray(decode_resized(data, (s, s))))
            else:
                im: EncodedImage = prepare_image(data, opts.images)
                images.append(im)
                w, h = im.width, im.height
            sizes.append((w, h))
        videos = self._videos(sample, root)
        require_video_policy(self.text, len(videos))
        try:
            tokens = self.text.encode(replace(sample.to_conversation(), image_sizes=tuple(sizes)))
        except TemplateError as exc:
            raise RowProblem(Skip.TEMPLATE_ERROR, str(exc)) from None
        except ValueError as exc:
            raise RowProblem(Skip.MARKER_MISMATCH, str(exc)) from None
        return safe_key(row.id), sample.meta, tokens, images, sizes, videos

    def _videos(self, sample, root: str) -> list:
        """The sample's clips, read within --max-video-bytes and probed (a hostile clip: its probe's skip),
        and its frame lists, each stored as one video (`prepare_frame_list`)."""
        if sample.videos and self.opts.format == "memmap":
            raise RowProblem(Skip.VIDEO_UNSUPPORTED, "memmap shards store no clips; use --format wds")
        return [prepare_frame_list(ref, lambda path: read_ref(path, root, self.opts.access, self.opts.storage_options),
                                   self.opts.videos) if isinstance(ref, FrameList) else self._clip(ref, root)
                for ref in sample.videos]

    def _clip(self, ref, root: str):
        access = replace(self.opts.access, max_bytes=self.opts.videos.max_bytes)
        try:
            data = decode_data_url(ref, access.max_bytes, "video") if is_data_url(ref) else \
                read_ref(ref, root, access, self.opts.storage_options)
        except RowProblem as exc:
            if exc.reason != Skip.FILE_TOO_LARGE:
                raise
            name = "an embedded clip" if not isinstance(ref, str) or is_data_url(ref) else ref
            raise RowProblem(Skip.FILE_TOO_LARGE, f"{name}: larger than --max-video-bytes "
                                                  f"{access.max_bytes}") from None
        return prepare_video(data, ref, self.videos)

    def _sidecar(self, sample, root: str) -> str:
        if sample.caption_file is None:
            raise RowProblem(Skip.MISSING_TEXT, f"no sidecar .txt for {(sample.images + sample.videos)[0]}")
        raw = read_ref(sample.caption_file, root, self.opts.access, self.opts.storage_options)
        try:
            return raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:   # position only: a rejected file's bytes never reach the manifest
            raise RowProblem(Skip.BAD_TEXT, f"sidecar {sample.caption_file} is not UTF-8 (at byte {exc.start})") from None


class _Parts:
    """The job's shard parts, rolled over by size."""

    def __init__(self, opts: JobOptions, job: int, image_token_id: int, video_token_id: int | None = None):
        self.opts = opts
        self.job = job
        self.image_token_id = image_token_id
        self.video_token_id = video_token_id
        self.writer = None
        self.infos: list[ShardInfo] = []

    def _open(self):
        stem = output_shard_stem(self.job, len(self.infos))
        if self.opts.format == "memmap":
            return MemmapPartWriter(self.opts.output, stem, self.opts.image_size, self.opts.storage_options,
                                    self.opts.fsync)
        return WdsPartWriter(self.opts.output, stem, self.image_token_id, self.opts.storage_options, self.opts.fsync,
                             self.video_token_id)

    def add(self, key: str, meta: dict, tokens: np.ndarray, images: list, sizes, videos: list = ()) -> None:
        if self.opts.format == "memmap":
            est = sum(im.nbytes for im in images) + tokens.shape[1] * 5 + 1024
        else:
            est = sample_bytes_estimate(b"x" * 1024, tokens, images, videos)
        if self.writer is not None and len(self.writer) and self.writer.offset + est > self.opts.max_shard_bytes:
            self.infos.append(self.writer.close())
            self.writer = None
        if self.writer is None:
            self.writer = self._open()
        if self.opts.format == "memmap":
            self.writer.add(key, meta, tokens, images, sizes)
        else:
            self.writer.add(key, meta, tokens, images, videos)

    def close(self) -> list[ShardInfo]:
        if self.writer is not None and len(self.writer):
            self.infos.append(self.writer.close())
        elif self.writer is not None:
            self.writer.abort()
        self.writer = None
        return self.infos

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()


class _Unexpected:
    """Logs the first unexpected exception of each type a row raised (with its traceback), once per job."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def note(self, row: Row, exc: Exception) -> str:
        name = type(exc).__name__
        if name not in self.seen:
            self.seen.add(name)
            log.warning("row %s (source %d, row %d) raised %s; counted as %s, the run goes on",
                        row.id, row.source, row.number, name, Skip.BAD_ROW, exc_info=exc)
        return f"unexpected {name}: {str(exc)[:200]}"


def run_job(spec: JobSpec, opts: JobOptions, report: Callable[[int, int], None] | None = None) -> dict:
    """Run one job to completion; returns its stats as a dict (also written to _jobs/).

    `report(rows_done, written_done)` is called after every row (it throttles itself).
    """
    t0 = time.perf_counter()
    text = load_text_encoder(opts.tokenizer, opts.train_on, opts.family)
    sampler = _Sampler(opts, text)
    stats = JobStats(job=spec.job, rows=len(spec.rows))
    parts = _Parts(opts, spec.job, text.image_token_id, text.video_token_id if encodes_video(text) else None)
    unexpected = _Unexpected()
    if opts.datasets:
        fill_rows(spec.rows, opts.datasets, opts.storage_options)
    try:
        for done, row in enumerate(spec.rows, 1):
            try:
                key, meta, tokens, images, sizes, videos = sampler.build(row)
            except SkipError as exc:
                stats.skip(exc.reason, row, str(exc))
            except Exception as exc:   # one row never ends the run: RecursionError, MemoryError, library bugs
                stats.skip(Skip.BAD_ROW, row, unexpected.note(row, exc))
            else:
                try:
                    parts.add(key, meta, tokens, images, sizes, videos)
                except RecursionError:   # a record nested too deep to serialise: the tar writer wrote nothing yet
                    stats.skip(Skip.BAD_ROW, row, "record cannot be written as JSON: RecursionError")
                else:
                    stats.written += 1
                    stats.images += len(images)
                    stats.videos += len(videos)
            if report is not None:
                report(done, stats.written)
        infos = parts.close()
    except BaseException:
        parts.abort()
        raise
    stats.shards = [asdict(i) for i in infos]
    stats.seconds = round(time.perf_counter() - t0, 3)
    if stats.written + sum(stats.skipped.values()) != stats.rows:
        raise AssertionError(f"job {spec.job}: rows {stats.rows} != written + skipped")
    fsutil.atomic_write_bytes(fsutil.join(opts.output, job_stats_name(spec.job)), stats.to_json(),
                              opts.storage_options, opts.fsync)
    return asdict(stats)
