"""`vlmdata retokenize`: add a text view for another model to a sharded dataset, reading no image bytes.

For every shard: its index, then only the bytes of each sample's text member
(the `.json` source record of vlmdata's shards, the caption member of shards
indexed in place, the meta section of memmap shards) by ranged reads; each
record is normalised as at shard time (`ingest.records`), encoded with the new
model's tokenizer and chat template in one batch, and written as the view's
token file (`formats.text_view`). Then the view's planning column, then the
manifest entry naming the view (last: a view is complete or absent). Image
members are never read, rewritten or copied; `RetokenizeResult.bytes_read`
counts every byte read.

A sample the new tokenizer cannot encode (a template error, an image-count
mismatch) gets no tokens in the view and is counted by reason; the loader skips it.
So does a sample whose stored text is larger than `max_text_bytes` (text_too_large;
never read: a 20 MB caption made the tokenizer take ~5 GB). The worker processes
die with the command, even when it is killed with SIGKILL (`sysinfo.die_with_parent`).
"""
from __future__ import annotations

import io
import json
import logging
import os
import struct
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
from fsspec.core import url_to_fs

from vlmdata import fsutil
from vlmdata.errors import ConfigError, RowProblem, Skip
from vlmdata.formats.manifest import Manifest
from vlmdata.formats.sample_index import SampleIndex
from vlmdata.formats.text_view import ViewTokens, check_view_name, view_planning_name, view_shard_name
from vlmdata.ingest.job import merge_skips
from vlmdata.ingest.records import ColumnSpec, normalize
from vlmdata.ingest.shard import view_name
from vlmdata.ingest.skips import SkipSummary, check_skip_fraction, check_skips
from vlmdata.ingest.video import require_video_policy
from vlmdata.sysinfo import die_with_parent
from vlmdata.text.chat_template import TemplateError
from vlmdata.text.conversation import Conversation, messages_from_turns
from vlmdata.text.encoder import load_text_encoder

__all__ = ["RangeReader", "RetokenizeConfig", "RetokenizeResult", "retokenize_dataset"]

log = logging.getLogger(__name__)
_TRAILER = struct.Struct("<8sQ")
DEFAULT_MAX_TEXT_BYTES = 1 << 20   # a stored record this large is ~250k tokens: longer than any pack


@dataclass
class RetokenizeConfig:
    """Options of `vlmdata retokenize` (see `vlmdata retokenize --help`)."""

    dataset: str
    tokenizer: str
    view: str | None = None          # default: the model folder's name
    train_on: str = "assistant"
    family: str | None = None
    workers: int | None = None       # processes (default: CPU count; 0 = inline)
    make_default: bool = False       # the new view becomes the dataset's default view
    overwrite: bool = False          # replace an existing view of the same name
    storage_options: dict = field(default_factory=dict)
    fsync: bool = True
    max_skip_fraction: float = 1.0   # TooManySkipsError above it, after the view is added (1: never)
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES   # larger stored texts are skipped (text_too_large), not read


@dataclass
class RetokenizeResult:
    manifest: Manifest
    view: str
    samples: int
    encoded: int
    skipped: dict[str, int]
    bytes_read: int
    seconds: float
    ranges: dict[str, list[tuple[int, int]]] = field(default_factory=dict)   # shard -> byte ranges read from it
    examples: dict[str, dict] = field(default_factory=dict)   # reason -> its first skipped sample


class RangeReader:
    """Reads byte ranges of one file and counts them (what retokenize reads, and all of it)."""

    def __init__(self, url: str, storage_options: dict):
        self.url = url
        self.fs, self.path = url_to_fs(url, **storage_options)
        self.bytes_read = 0
        self.ranges: list[tuple[int, int]] = []

    def read(self, starts: list[int], ends: list[int]) -> list[bytes]:
        if not starts:
            return []
        self.ranges += list(zip(starts, ends))
        self.bytes_read += int(sum(e - s for s, e in zip(starts, ends)))
        if fsutil.is_local(self.url):
            with open(fsutil.local_path(self.url), "rb") as f:
                out = []
                for s, e in zip(starts, ends):
                    f.seek(s)
                    out.append(f.read(e - s))
                return out
        return self.fs.cat_ranges([self.path] * len(starts), list(starts), list(ends))

    def tail(self, n: int, size: int) -> bytes:
        return self.read([size - n], [size])[0]


@dataclass(frozen=True)
class _Task:
    root: str
    shard: dict          # ShardInfo as a dict
    kind: str
    layout: dict
    view: str
    tokenizer: str
    train_on: str
    family: str | None
    columns: ColumnSpec
    storage_options: dict
    fsync: bool
    max_text_bytes: int


_TOO_LARGE = object()    # the text of a sample over the limit (not read)


def _memmap_meta_base(reader: RangeReader, size: int) -> int:
    magic, length = _TRAILER.unpack(reader.tail(_TRAILER.size, size))
    if magic != b"VLMMMAP1":
        raise ConfigError(f"{reader.url} is not a vlmdata memmap shard")
    footer = json.loads(reader.read([size - _TRAILER.size - length], [size - _TRAILER.size])[0])
    return int(footer["sections"]["meta"])


def _texts(task: _Task, ix: SampleIndex, reader: RangeReader) -> list:
    """The text member of every sample (source record, or caption for shards indexed in place); None when
    it has none, `_TOO_LARGE` (unread) when it is larger than the task's limit."""
    own = task.layout.get("text", "tok.npy") == "tok.npy"
    if own:
        offsets, sizes = ix.meta_offset.astype(np.int64), ix.meta_size.astype(np.int64)
        if task.kind == "memmap":
            offsets = offsets + _memmap_meta_base(reader, int(task.shard["bytes"]))
    else:
        offsets, sizes = ix.tok_offset.astype(np.int64), ix.tok_size.astype(np.int64)
    have = offsets >= 0
    large = have & (sizes > task.max_text_bytes)
    want = have & ~large
    got = iter(reader.read(offsets[want].tolist(), (offsets + sizes)[want].tolist()))
    return [_TOO_LARGE if big else next(got) if w else None for w, big in zip(want.tolist(), large.tolist())]


def _conversation(task: _Task, raw, key: str, sizes: tuple[tuple[int, int], ...]) -> Conversation:
    """The sample's conversation from its stored text, with its images' stored sizes."""
    n_images = len(sizes)
    if raw is _TOO_LARGE:
        raise RowProblem(Skip.TEXT_TOO_LARGE, f"stored text over the {task.max_text_bytes}-byte limit "
                                              "(--max-text-bytes)")
    if raw is None:
        raise RowProblem(Skip.MISSING_TEXT, "the sample has no stored text member")
    if task.layout.get("text", "tok.npy") != "tok.npy":   # a caption member of a shard indexed in place
        text = json.loads(raw)[task.layout.get("json_field", "caption")] if task.layout["text"] == "json" \
            else raw.decode("utf-8")
        return Conversation(messages_from_turns([("user", ""), ("assistant", str(text))], n_images), n_images,
                            image_sizes=sizes)
    try:
        row = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RowProblem(Skip.BAD_ROW, f"stored record is not JSON: {exc}") from None
    conv = normalize(row, key, task.columns, native=True).to_conversation()
    if conv.n_images != n_images:
        raise RowProblem(Skip.MARKER_MISMATCH, f"the record names {conv.n_images} images, the shard holds {n_images}")
    return replace(conv, image_sizes=sizes)


def _run_shard(task: _Task) -> dict:
    t0 = time.perf_counter()
    info = task.shard
    so = task.storage_options
    ix = SampleIndex.load(fsutil.join(task.root, info["index"]), so)
    index_bytes = len(ix.to_bytes())
    if task.layout.get("compression") == "gzip":
        raise ConfigError(f"{info['name']} is gzip-compressed: its text members cannot be read apart from its "
                          "images; re-shard it with `vlmdata shard` to add views")
    reader = RangeReader(fsutil.join(task.root, info["name"]), so)
    raws = _texts(task, ix, reader)
    encoder = load_text_encoder(task.tokenizer, task.train_on, task.family)
    keys = ix.keys()
    convs: list[Conversation | None] = []
    skipped: dict[str, int] = {}
    examples: dict[str, dict] = {}

    def skip(reason: str, i: int, detail: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1
        examples.setdefault(reason, {"shard": info["name"], "key": keys[i], "detail": detail[:300]})

    for i, raw in enumerate(raws):
        try:
            at = ix.image_slice(i)
            conv = _conversation(task, raw, keys[i], tuple(zip(ix.width[at].tolist(), ix.height[at].tolist())))
            require_video_policy(encoder, conv.n_videos)   # a view whose model lays out no videos: no tokens
            if conv.n_videos:      # planning.npz's video_tokens follow the dataset's own family, not the view's
                raise RowProblem(Skip.VIDEO_UNSUPPORTED, f"{conv.n_videos} clip(s): text views of samples with "
                                                         "clips are not built yet (shard with the model folder)")
            convs.append(conv)
        except RowProblem as exc:
            convs.append(None)
            skip(exc.reason, i, str(exc))
    todo = [i for i, c in enumerate(convs) if c is not None]
    encoded = encoder.encode_batch([convs[i] for i in todo])
    tokens: list[np.ndarray | None] = [None] * len(convs)
    for i, out in zip(todo, encoded):
        if isinstance(out, TemplateError):
            skip(Skip.TEMPLATE_ERROR, i, str(out))
        elif isinstance(out, Exception):
            skip(Skip.MARKER_MISMATCH, i, str(out))
        else:
            tokens[i] = out
    vt = ViewTokens.build(tokens)
    fsutil.atomic_write_bytes(fsutil.join(task.root, view_shard_name(task.view, info["name"])), vt.to_bytes(), so,
                              task.fsync)
    return {"shard": info["name"], "samples": len(convs), "encoded": len(convs) - sum(skipped.values()),
            "skipped": skipped, "examples": examples, "text_tokens": vt.text_tokens(ix.n_images.astype(np.int64)),
            "bytes_read": reader.bytes_read + index_bytes, "ranges": reader.ranges, "seconds": time.perf_counter() - t0}


def retokenize_dataset(cfg: RetokenizeConfig, progress: Callable[[int], None] | None = None) -> RetokenizeResult:
    """Add the text view of `cfg.tokenizer` to `cfg.dataset` (see the module docstring). More than
    `cfg.max_skip_fraction` of the samples skipped raises TooManySkipsError once the view is added."""
    t0 = time.perf_counter()
    check_skip_fraction(cfg.max_skip_fraction)
    so = cfg.storage_options
    manifest = Manifest.load(cfg.dataset, so)
    encoder = load_text_encoder(cfg.tokenizer, cfg.train_on, cfg.family)   # config errors before any work
    identity = encoder.identity()
    name = check_view_name(view_name(cfg.tokenizer, cfg.view))
    if name in manifest.views and not cfg.overwrite:
        raise ConfigError(f"{cfg.dataset} already has a text view {name!r}; pass --view NAME for another name or "
                          "--overwrite to replace it")
    if name in manifest.views and manifest.views[name].get("tokens") == "tar":
        raise ConfigError(f"view {name!r} is the one stored in the shards; choose another --view name")
    if name == "default" and not manifest.views:
        raise ConfigError("'default' names the dataset's existing view; choose another --view name")
    columns = ColumnSpec(**{k: v for k, v in (manifest.stats.get("columns") or {}).items()
                            if k in ("image", "text", "id")})
    tasks = [_Task(cfg.dataset, s.__dict__, manifest.kind, manifest.layout, name, cfg.tokenizer, cfg.train_on,
                   cfg.family, columns, so, cfg.fsync, cfg.max_text_bytes) for s in manifest.shards]
    workers = (os.cpu_count() or 1) if cfg.workers is None else cfg.workers
    results = []
    if workers <= 0 or len(tasks) <= 1:
        for t in tasks:
            results.append(_run_shard(t))
            if progress:
                progress(results[-1]["samples"])
    else:
        with ProcessPoolExecutor(min(workers, len(tasks)), initializer=die_with_parent) as pool:
            for r in pool.map(_run_shard, tasks):
                results.append(r)
                if progress:
                    progress(r["samples"])
    buf = io.BytesIO()
    text_tokens = np.concatenate([r["text_tokens"] for r in results]) if results else np.zeros(0, np.int32)
    np.savez(buf, text_tokens=text_tokens.astype(np.int32))
    fsutil.atomic_write_bytes(fsutil.join(cfg.dataset, view_planning_name(name)), buf.getvalue(), so, cfg.fsync)
    skipped, examples = merge_skips(results)
    samples = sum(r["samples"] for r in results)
    encoded = sum(r["encoded"] for r in results)
    if samples and not encoded:
        reason, ex = next(iter(examples.items()))
        raise ConfigError(f"the tokenizer {cfg.tokenizer} encoded none of the {samples} samples ({reason}: "
                          f"{ex['detail']}); no view was added")
    seconds = time.perf_counter() - t0
    manifest = Manifest.load(cfg.dataset, so)  # re-read: the entry is added to the newest manifest
    if not manifest.views:  # a dataset from before views: name the view stored in its shards
        manifest.views = {"default": {"tokenizer": manifest.tokenizer, "tokens": "tar"}}
        manifest.default_view = "default"
    manifest.views[name] = {"tokenizer": identity, "tokens": "sidecar", "dir": f"views/{name}",
                            "train_on": cfg.train_on, "samples": encoded, "skipped": dict(sorted(skipped.items())),
                            "examples": examples, "seconds": round(seconds, 3),
                            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if cfg.make_default:
        manifest.default_view = name
        manifest.tokenizer = identity
    manifest.save(cfg.dataset, so)
    result = RetokenizeResult(manifest=manifest, view=name, samples=samples, encoded=encoded, skipped=skipped,
                              bytes_read=sum(r["bytes_read"] for r in results), seconds=seconds,
                              ranges={r["shard"]: r["ranges"] for r in results}, examples=examples)
    summary = SkipSummary(samples, skipped, examples, "samples")
    check_skips(summary, cfg.max_skip_fraction, result)
    return result
