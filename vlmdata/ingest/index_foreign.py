"""`index_dataset`: index WebDataset shards written by other tools, in place and in parallel.

Each shard (plain `.tar` or gzip `.tar.gz`/`.tgz`) is read once, sequentially,
by one worker process: tar headers give member offsets (offsets in the
uncompressed stream for gzip shards: the manifest's layout then says
`"compression": "gzip"`), image headers give sizes, the text member (`.txt`,
or a field of `.json`) gives the token count. Written next to each shard:
its `.index.npz` and, for plain tars, a DALI `.idx`; at the root, the
manifest, `planning.npz` and `keys.lmdb` (ingest.finalize). The tars are never rewritten. Samples that
cannot be used (no text, bad image, duplicate key in the shard) are left out
of the index and counted by reason.

Hostile tars cost only themselves, with bounded memory: a malformed header
ends the shard as one counted `corrupt_shard` (the samples before it stay
indexed); a member larger than `max_member_bytes` is skipped unread
(`member_too_large`); a key that comes back after another sample, or twice
in a row (a member extension repeated), is a `duplicate_key` (the first one
wins, samples are never merged); a sample with a link, device or FIFO member
is a `link_member`; one with a name that is not UTF-8 a `bad_member_name`.
"""
from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field

from fsspec.core import url_to_fs

from vlmdata import fsutil
from vlmdata.errors import ConfigError, ImageProblem, Skip, TarFormatError
from vlmdata.formats.dali_idx import Member, format_index
from vlmdata.formats.manifest import Manifest, ShardInfo
from vlmdata.formats.sample_index import IndexBuilder
from vlmdata.formats.tar_scan import CountingReader, TarEntry, is_utf8_name, scan_tar, split_key
from vlmdata.ingest.access import DEFAULT_MAX_IMAGE_BYTES
from vlmdata.ingest.finalize import write_dataset_tables
from vlmdata.ingest.foreign_shards import SHARD_SUFFIXES
from vlmdata.ingest.images import DEFAULT_MAX_PIXELS, MAX_IMAGES_PER_SAMPLE, check_image
from vlmdata.ingest.job import merge_skips
from vlmdata.ingest.lengths import LengthCounter, dataset_policy
from vlmdata.ingest.skips import SkipSummary, check_skip_fraction, check_skips
from vlmdata.text.tokenizer import encode_conversation, load_tokenizer

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
JSON_TEXT_FIELDS = ("caption", "text", "txt", "prompt")


@dataclass
class IndexConfig:
    """Options of `vlmdata index`."""

    root: str
    text: str = "auto"                 # "auto" | "txt" | "json"
    json_field: str | None = None      # default: first of caption/text/txt/prompt
    tokenizer: str | None = None
    workers: int | None = None
    max_image_pixels: int = DEFAULT_MAX_PIXELS
    storage_options: dict = field(default_factory=dict)
    max_member_bytes: int = DEFAULT_MAX_IMAGE_BYTES   # larger image/text members are skipped unread
    max_skip_fraction: float = 1.0     # TooManySkipsError above it, after writing (1: never)


@dataclass(frozen=True)
class _ShardTask:
    root: str
    name: str
    layout: dict
    tokenizer: str | None
    max_pixels: int
    storage_options: dict
    max_member_bytes: int = DEFAULT_MAX_IMAGE_BYTES


def strip_tar_suffix(name: str) -> str:
    """A foreign shard's file name without its .tar, .tar.gz or .tgz suffix."""
    for suffix in (".tar.gz", ".tgz", ".tar"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def is_gzip(name: str) -> bool:
    return name.endswith((".gz", ".tgz"))


def list_shards(root: str, storage_options: dict | None = None) -> list[str]:
    """Shard files under `root` (recursive), as sorted paths relative to it."""
    fs, path = url_to_fs(root, **(storage_options or {}))
    if not fs.isdir(path):
        raise ConfigError(f"{root} is not a directory of shards")
    path = path.rstrip("/")
    names = [p[len(path) + 1:] for p in fs.find(path)]
    return sorted(n for n in names if n.endswith(SHARD_SUFFIXES) and not os.path.basename(n).startswith("."))


def _open_stream(raw, name: str) -> tuple[CountingReader, CountingReader]:
    outer = CountingReader(raw)
    if is_gzip(name):
        return outer, CountingReader(gzip.GzipFile(fileobj=outer, mode="rb"), crc=False)
    return outer, outer


def detect_layout(root: str, first_shard: str, cfg: IndexConfig) -> dict:
    """Which member holds the text, from the first members of the first shard."""
    layout: dict = {}
    if cfg.text != "auto":
        layout["text"] = cfg.text
    exts, first_json, damage = set(), None, None
    with fsutil.open_url(fsutil.join(root, first_shard), "rb", cfg.storage_options) as raw:
        _, stream = _open_stream(raw, first_shard)
        try:
            for n, (entry, s) in enumerate(scan_tar(stream)):
                ext = split_key(entry.name)[1]
                exts.add(ext)
                if ext == "json" and first_json is None and entry.size <= cfg.max_member_bytes:
                    first_json = s.read(entry.size)
                if n >= 64:
                    break
        except (TarFormatError, EOFError, OSError, zlib.error) as exc:
            damage = exc  # decide from what was readable; index_shard counts the damage
    if damage is not None and not exts:
        kind = "gzip-compressed tar" if is_gzip(first_shard) else "tar"
        raise ConfigError(f"cannot read the first shard {first_shard}: {type(damage).__name__}: {damage}; it is "
                          f"corrupt or not a {kind} file: repair or remove it (its text layout is read from it), "
                          "or pass --text txt|json")
    if "text" not in layout:
        if "txt" in exts:
            layout["text"] = "txt"
        elif first_json is not None:
            layout["text"] = "json"
        else:
            hint = f" (the shard is damaged after {len(exts)} member kinds: {damage})" if damage else ""
            raise ConfigError(f"no .txt or .json text members in {first_shard}{hint}; pass --text txt|json")
    if layout["text"] == "json":
        fields = (cfg.json_field,) if cfg.json_field else JSON_TEXT_FIELDS
        try:
            record = json.loads(first_json) if first_json else {}
        except (ValueError, RecursionError):
            record = {}
        found = next((f for f in fields if isinstance(record, dict) and f in record), None)
        if found is None:
            raise ConfigError(f"no caption field ({', '.join(fields)}) in the .json members; pass --json-field")
        layout["json_field"] = found
    elif layout["text"] != "txt":
        raise ConfigError(f"unknown --text {cfg.text!r}; use txt, json or auto")
    return layout


class _Group:
    """Members of one sample while it is being scanned."""

    def __init__(self, key: str, header: int):
        self.key = key
        self.header = header
        self.end = header
        self.members: list[Member] = []
        self.images: list[tuple[int, int, int, int]] = []
        self.text: tuple[int, int, bytes] | None = None
        self.meta: tuple[int, int, bytes] | None = None
        self.problem: tuple[str, str] | None = None
        self.exts: set[str] = set()

    def holds(self, ext: str) -> bool:
        """True when this sample already has a member with extension `ext` (a repeated key)."""
        return ext in self.exts


def _read_member(group: _Group, entry: TarEntry, stream: CountingReader, task: _ShardTask) -> None:
    ext = split_key(entry.name)[1]
    group.exts.add(ext)
    group.end = entry.data + (entry.size + 511) // 512 * 512
    if group.problem is not None:
        return   # the sample is skipped: its members are not read (scan_tar skips their data)
    if len(group.members) > 2 * MAX_IMAGES_PER_SAMPLE:
        group.problem = (Skip.TOO_MANY_IMAGES, f"more than {2 * MAX_IMAGES_PER_SAMPLE} members")
        return
    group.members.append(Member(name=entry.name, offset=entry.data, size=entry.size))
    if entry.kind != "file":
        group.problem = (Skip.LINK_MEMBER, f"{entry.name!r} is a {entry.kind} member, not a file")
        return
    if not is_utf8_name(entry.name):
        group.problem = (Skip.BAD_MEMBER_NAME, f"member name {entry.name.encode('utf-8', 'replace')!r} is not UTF-8")
        return
    suffix = ext.rsplit(".", 1)[-1].lower()
    readable = suffix in IMAGE_EXTS or ext in ("txt", "json")
    if readable and entry.size > task.max_member_bytes:
        group.problem = (Skip.MEMBER_TOO_LARGE, f"{entry.name}: {entry.size} bytes > limit {task.max_member_bytes}")
        return
    if suffix in IMAGE_EXTS:
        if len(group.images) >= MAX_IMAGES_PER_SAMPLE:
            group.problem = (Skip.TOO_MANY_IMAGES, f"more than {MAX_IMAGES_PER_SAMPLE} images")
            return
        data = stream.read(entry.size)
        try:
            _, w, h = check_image(data, task.max_pixels)
            group.images.append((entry.data, entry.size, w, h))
        except ImageProblem as exc:
            group.problem = (exc.reason, f"{entry.name}: {exc}")
    elif ext == "txt" or ext == "json":
        data = stream.read(entry.size)
        loc = (entry.data, entry.size, data)
        if ext == "json":
            group.meta = loc
        if ext == task.layout["text"]:
            group.text = loc


def _caption(group: _Group, layout: dict) -> str:
    if group.text is None:
        raise ImageProblem(Skip.MISSING_TEXT, f"no .{layout['text']} member")
    raw = group.text[2]
    try:
        if layout["text"] == "json":
            value = json.loads(raw).get(layout["json_field"])
        else:
            value = raw.decode("utf-8")
    except UnicodeDecodeError as exc:   # the position only: the member's bytes stay out of the manifest
        raise ImageProblem(Skip.BAD_TEXT, f"not UTF-8 (at byte {exc.start})") from None
    except (ValueError, RecursionError, AttributeError) as exc:   # bad JSON, 5000-digit numbers, depth
        raise ImageProblem(Skip.BAD_TEXT, f"{type(exc).__name__}: {str(exc)[:120]}") from None
    if not isinstance(value, str):
        raise ImageProblem(Skip.BAD_TEXT, f"caption is a {type(value).__name__}, not a string")
    if not value.strip():
        raise ImageProblem(Skip.EMPTY_TEXT, "empty caption")
    return value


def index_shard(task: _ShardTask) -> dict:
    """Index one shard; writes its .index.npz (and .idx for plain tars); returns its stats."""
    tok = load_tokenizer(task.tokenizer)
    builder = IndexBuilder()
    samples: list[list[Member]] = []
    stats = {"name": task.name, "rows": 0, "written": 0, "skipped": {}, "examples": {}}
    seen: set[str] = set()   # every key of the shard so far (written or skipped): the first one wins

    def skip(reason: str, key: str, detail: str) -> None:
        stats["skipped"][reason] = stats["skipped"].get(reason, 0) + 1
        stats["examples"].setdefault(reason, {"shard": task.name, "id": key, "detail": detail[:300]})

    def finish(g: _Group | None) -> None:
        if g is None:
            return
        stats["rows"] += 1
        duplicate = g.key in seen
        seen.add(g.key)
        try:
            if duplicate:
                raise ImageProblem(Skip.DUPLICATE_KEY, f"key {g.key!r} appears twice in the shard")
            if g.problem is not None:
                raise ImageProblem(*g.problem)
            text = _caption(g, task.layout)
            tokens = encode_conversation(tok, [("user", ""), ("assistant", text)], len(g.images))
        except ImageProblem as exc:
            skip(exc.reason, g.key.encode("utf-8", "replace").decode("utf-8"), str(exc))
            return
        meta = (g.meta[0], g.meta[1]) if g.meta is not None else (-1, 0)
        builder.add(g.key, offset=g.header, span=g.end - g.header, tok=(g.text[0], g.text[1]), meta=meta,
                    text_tokens=tokens.shape[1] - len(g.images), images=g.images)
        samples.append(g.members)
        stats["written"] += 1

    url = fsutil.join(task.root, task.name)
    group: _Group | None = None
    with fsutil.open_url(url, "rb", task.storage_options) as raw:
        outer, stream = _open_stream(raw, task.name)
        try:
            for entry, s in scan_tar(stream, specials=True):
                key, ext = split_key(entry.name)
                if group is None or key != group.key or group.holds(ext):
                    finish(group)
                    group = _Group(key, entry.header)
                _read_member(group, entry, s, task)
            finish(group)
        except (TarFormatError, EOFError, OSError, zlib.error) as exc:
            if group is not None and (not samples or samples[-1] is not group.members):
                stats["rows"] += 1
                if group.problem is not None:   # e.g. member_too_large: its skip, then the end of the stream
                    skip(group.problem[0], group.key, group.problem[1])
                else:
                    skip(Skip.TRUNCATED_SAMPLE, group.key, f"shard ends inside this sample: {exc}")
            skip(Skip.CORRUPT_SHARD, task.name, str(exc))
        outer.drain()
    index = builder.build()
    stem = strip_tar_suffix(task.name)
    info = ShardInfo(name=task.name, index=f"{stem}.index.npz", samples=len(index), images=index.n_image_total,
                     bytes=outer.pos, crc32=outer.crc & 0xFFFFFFFF, files=[task.name])
    if len(index):
        index.describes(info.bytes, info.crc32).save(fsutil.join(task.root, info.index), task.storage_options)
        if any(c.isspace() for members in samples for m in members for c in m.name):
            stats["no_dali_index"] = "member names with whitespace cannot be written to a DALI .idx"
        elif not is_gzip(task.name):
            info.dali_index = f"{stem}.idx"
            fsutil.atomic_write_bytes(fsutil.join(task.root, info.dali_index), format_index(samples),
                                      task.storage_options)
    stats["shard"] = asdict(info)
    return stats


def index_dataset(cfg: IndexConfig, progress=None) -> Manifest:
    """Index every shard under `cfg.root` and write the manifest; returns it. More than
    `cfg.max_skip_fraction` of the samples skipped raises TooManySkipsError once the manifest is written."""
    t0 = time.perf_counter()
    check_skip_fraction(cfg.max_skip_fraction)
    if cfg.tokenizer and os.path.isdir(cfg.tokenizer):
        raise ConfigError(f"{cfg.tokenizer} is a model folder: index the shards without --tokenizer, then add the "
                          f"model's text view with `vlmdata retokenize {cfg.root} --tokenizer {cfg.tokenizer}`")
    try:
        tokenizer = load_tokenizer(cfg.tokenizer)
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigError(f"cannot load tokenizer {cfg.tokenizer!r}: {exc}") from exc
    if not fsutil.exists(cfg.root, cfg.storage_options):
        raise ConfigError(f"{cfg.root} does not exist")
    names = list_shards(cfg.root, cfg.storage_options)
    if not names:
        raise ConfigError(f"no .tar, .tar.gz or .tgz shards under {cfg.root}")
    gz = {is_gzip(n) for n in names}
    if len(gz) > 1:
        raise ConfigError("mixed plain and gzip-compressed shards; index them as two datasets")
    layout = detect_layout(cfg.root, names[0], cfg)
    if gz == {True}:
        layout["compression"] = "gzip"
    tasks = [_ShardTask(cfg.root, n, layout, cfg.tokenizer, cfg.max_image_pixels, cfg.storage_options,
                        cfg.max_member_bytes) for n in names]
    workers = (os.cpu_count() or 1) if cfg.workers is None else cfg.workers
    results = []
    if workers <= 0 or len(tasks) == 1:
        results = [index_shard(t) for t in tasks]
        if progress is not None:
            for r in results:
                progress(r["rows"], r["written"])
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx) as pool:
            for r in pool.map(index_shard, tasks):
                results.append(r)
                if progress is not None:
                    progress(r["rows"], r["written"])
    manifest = _write_manifest(cfg, results, layout, tokenizer.identity(), time.perf_counter() - t0)
    check_skips(SkipSummary.from_stats(manifest.stats, "samples"), cfg.max_skip_fraction, manifest)
    return manifest


def _write_manifest(cfg: IndexConfig, results: list[dict], layout: dict, tokenizer: dict, seconds: float) -> Manifest:
    so = cfg.storage_options
    shards = [ShardInfo(**r["shard"]) for r in results if r["shard"]["samples"]]
    manifest = Manifest(kind="webdataset", shards=shards, tokenizer=tokenizer, layout=layout)
    lengths = LengthCounter(dataset_policy(manifest))
    keys = write_dataset_tables(cfg.root, shards, so, on_index=lengths.add_index)
    skipped, examples = merge_skips(results)
    stats = {"input_rows": sum(r["rows"] for r in results), "samples": sum(s.samples for s in shards),
             "images": sum(s.images for s in shards), "skipped": dict(sorted(skipped.items())),
             "skipped_total": sum(skipped.values()), "examples": examples, "shards_found": len(results),
             "duplicate_keys_across_shards": keys["duplicates"], "duplicate_key_examples": keys["duplicate_examples"],
             "seconds": round(seconds, 3), "indexed_in_place": True,
             "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "lengths": lengths.report(cfg.root, manifest, so).to_stats()}
    manifest.stats = stats
    manifest.save(cfg.root, so)
    return manifest
