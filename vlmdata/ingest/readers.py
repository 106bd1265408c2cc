"""Streaming readers for raw inputs: every row of every input, in order, with bounded memory.

Formats: "json" (a top-level JSON array, e.g. LLaVA), "jsonl", "csv", "parquet",
"folder" (images or video clips with sidecar .txt captions) and "hf-dataset" (a Hugging Face `datasets`
`save_to_disk` folder, or a Dataset / IterableDataset object given as an input: ingest.hf_datasets).
WebDataset tars are refused with the `vlmdata index` command to run (ingest.foreign_shards); a
remote input that cannot be reached is one ConfigError line. Rows are plain dicts; a row
that cannot be parsed becomes a `Row` with `error` set, so it is counted, not lost.
A malformed row costs one row and never the rest of its input (see
`ingest.json_array`, `ingest.csv_rows`; a JSONL line is one row, whatever it
holds); a Parquet file whose footer cannot be read is a ConfigError naming it,
before any work, and an unreadable row group counts each of its rows.
"""
from __future__ import annotations

import io
import json
import os
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass

from fsspec.core import url_to_fs

from vlmdata import fsutil
from vlmdata.errors import ConfigError
from vlmdata.ingest.access import call_with_deadline
from vlmdata.ingest.csv_rows import iter_csv_rows
from vlmdata.ingest.foreign_shards import index_instead, is_shard_folder, is_shard_name
from vlmdata.ingest.hf_datasets import (
    HF_DATASET_FORMAT,
    dataset_label,
    is_dataset_object,
    read_saved_dataset,
    saved_dataset_kind,
    splits_of,
)
from vlmdata.ingest.json_array import MAX_ITEM_CHARS, BadRow, iter_json_array

INPUT_FORMATS = ("json", "jsonl", "csv", "parquet", "folder", HF_DATASET_FORMAT)
IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")
CLIP_EXTS = (".mp4", ".m4v", ".mov", ".webm", ".mkv")     # video clips in a folder (each with its .txt caption)


@dataclass
class Row:
    """One input row: which input, its number there, and the parsed record or the parse error."""

    source: int
    number: int
    data: dict | None
    error: str | None = None
    id: str = ""               # source id, set by the sharder (see ingest.shard)
    duplicate: bool = False    # an earlier row of this run had the same key
    duplicate_in: str | None = None   # a --dedup-against dataset that already holds the key
    partial: bool = False      # data holds only the id columns: the job reads the record (ingest.hf_datasets)


@dataclass(frozen=True)
class InputSource:
    """One input: URL, its format, and the directory its relative image paths start from."""

    url: str
    format: str
    base: str


def _dirname(url: str) -> str:
    if fsutil.is_local(url):
        return os.path.dirname(os.path.abspath(fsutil.local_path(url)))
    return posixpath.dirname(url.rstrip("/"))


_TABLE_EXTS = ((".jsonl", "jsonl"), (".ndjson", "jsonl"), (".csv", "csv"), (".tsv", "csv"),
               (".parquet", "parquet"), (".json", "json"))
# What users type for --input-format besides INPUT_FORMATS: the row layout names (LLaVA chat rows,
# caption rows; gen_raw's --format) mean "a table file, its container format detected" (None),
# and a few common spellings of the container formats.
INPUT_FORMAT_ALIASES: dict[str, str | None] = {"llava": None, "caption": None, "table": None, "ndjson": "jsonl",
                                                "tsv": "csv", "imagefolder": "folder", "images": "folder",
                                                "datasets": HF_DATASET_FORMAT}


def format_names() -> str:
    """Every accepted --input-format name, for help and error messages."""
    return ", ".join((*INPUT_FORMATS, *INPUT_FORMAT_ALIASES))


def _table_format(path: str) -> str | None:
    lower = path.lower()
    return next((fmt for ext, fmt in _TABLE_EXTS if lower.endswith(ext)), None)


def _head(fs, path: str) -> bytes:
    with fs.open(path, "rb") as f:
        return f.read(4096).lstrip()


def _sniff(fs, path: str) -> str | None:
    head = _head(fs, path)
    if head.startswith(b"["):
        return "json"
    if head.startswith(b"{"):
        return "jsonl"
    if head.startswith(b"PAR1"):
        return "parquet"
    return None


def _directory_tables(fs, path: str, only: str | None = None) -> list[tuple[str, str]]:
    """(path, format) of the table files directly in a directory.

    A `.json` file counts only when it holds a JSON array (a top-level object,
    like gen_raw's corpus-side `corrupt.json`, is not a table of rows).
    """
    out = []
    for entry in sorted(fs.ls(path, detail=True), key=lambda e: e["name"]):
        if entry.get("type") != "file":
            continue
        fmt = _table_format(entry["name"])
        if fmt is None or (only is not None and fmt != only):
            continue
        if fmt == "json" and only is None and _sniff(fs, entry["name"]) != "json":
            continue
        out.append((entry["name"], fmt))
    return out


def _image_files(fs, path: str, limit: int | None = None) -> tuple[int, int]:
    """(image files, sidecar .txt files) under a directory (stops counting images at `limit`)."""
    images = texts = 0
    for f in fs.find(path):
        ext = os.path.splitext(f)[1].lower()
        images += ext in IMAGE_EXTS
        texts += ext == ".txt"
        if limit is not None and images >= limit:
            break
    return images, texts


def _join_like(url: str, path: str, fs) -> str:
    """A found path as a URL of the same kind as the directory URL it was found in."""
    if fsutil.is_local(url):
        return path
    return fs.unstrip_protocol(path)


def resolve_input(url: str, input_format: str | None = None,
                  storage_options: dict | None = None) -> tuple[str, str]:
    """(url, format) to read for one input: detects the format, and picks the table inside a directory.

    A directory holding exactly one table file (JSON array, JSONL, CSV, TSV,
    Parquet; e.g. gen_raw's `data.jsonl` beside `images/`) is read as that
    table, its relative image paths resolved from the directory; a directory
    without one is an image folder (images + sidecar .txt captions).
    `input_format` (a name of INPUT_FORMATS or INPUT_FORMAT_ALIASES) overrides.
    """
    if input_format is not None and input_format not in INPUT_FORMATS and input_format not in INPUT_FORMAT_ALIASES:
        raise ConfigError(f"unknown input format {input_format!r}; use one of {format_names()}")
    fmt = INPUT_FORMAT_ALIASES.get(input_format, input_format)
    fs, path = url_to_fs(url, **(storage_options or {}))
    if not fs.exists(path):
        hint = ("; check the repository and path, and that the Hugging Face Hub can be reached (HF_HUB_OFFLINE "
                "unset)") if url.startswith("hf://") else ""
        raise ConfigError(f"input {url} does not exist{hint}")
    if fs.isdir(path):
        if fmt == "folder":
            return url, "folder"
        saved = saved_dataset_kind(fs, path)
        if saved == "dataset":
            return url, HF_DATASET_FORMAT
        if saved == "dict":
            raise ConfigError(f"input {url} is a saved DatasetDict (splits {', '.join(splits_of(fs, path))}); "
                              f"pass one split's folder, e.g. {fsutil.join(url, splits_of(fs, path)[0])}")
        if fmt == HF_DATASET_FORMAT:
            raise ConfigError(f"input {url} is not a datasets save_to_disk folder (no dataset_info.json and "
                              "state.json)")
        tables = _directory_tables(fs, path, only=fmt)
        if fmt is None and is_shard_folder(fs, path, [t for t, _ in tables]):
            raise index_instead([url], {url})
        if len(tables) == 1:
            return _join_like(url, tables[0][0], fs), tables[0][1]
        if len(tables) > 1:
            names = ", ".join(os.path.basename(t) for t, _ in tables)
            raise ConfigError(f"input directory {url} holds several tables ({names}); pass the file(s) to "
                              "shard as inputs, or --input-format folder to read its images with sidecar .txt captions")
        if fmt is not None or input_format in INPUT_FORMAT_ALIASES:
            want = fmt or "table (JSON array, JSONL, CSV, TSV or Parquet)"
            raise ConfigError(f"input directory {url} holds no {want} file; pass the table file itself, or "
                              "--input-format folder for images with sidecar .txt captions")
        return url, "folder"
    if fmt is not None:
        return url, fmt
    fmt = _table_format(path)
    if fmt in (None, "json"):  # a .json file may hold JSON lines: its first byte decides
        fmt = _sniff(fs, path) or fmt
    if fmt is None:
        raise ConfigError(f"cannot tell the format of {url}; pass --input-format one of {format_names()}")
    return url, fmt


def detect_format(url: str, storage_options: dict | None = None) -> str:
    """Guess an input's format from its type, extension and first bytes (see `resolve_input`)."""
    return resolve_input(url, None, storage_options)[1]


def describe_input(src: InputSource, storage_options: dict | None = None) -> str:
    """What an input holds, in words, for error messages (lists folders; never reads a table)."""
    if src.format != "folder":
        return f"{src.url} read as {src.format}"
    fs, path = url_to_fs(src.url, **(storage_options or {}))
    images, texts = _image_files(fs, path)
    tables = [os.path.basename(t) for t, _ in _directory_tables(fs, path)]
    found = f"{images} image files, {texts} .txt files"
    if tables:
        found += f", tables {', '.join(tables)}"
    return f"{src.url} read as an image folder ({found})"


_CLIENTS = {"hf": "huggingface_hub", "s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}


def _resolve_reachable(url: str, input_format: str | None, so: dict | None, timeout: float) -> tuple[str, str]:
    """resolve_input, with a remote store's failure (missing client, no route, no answer in `timeout`
    seconds) as one ConfigError line."""
    if fsutil.is_local(url):
        return resolve_input(url, input_format, so)
    try:
        return call_with_deadline(lambda: resolve_input(url, input_format, so), timeout)
    except ConfigError:
        raise
    except ImportError as exc:
        scheme = url.split("://", 1)[0]
        package = _CLIENTS.get(scheme)
        need = f"needs the {package} package: pip install {package}" if package else str(exc).splitlines()[0][:200]
        raise ConfigError(f"cannot read input {url}: {scheme}:// {need}") from None
    except TimeoutError:
        why = f"no answer within {timeout:g} s (--remote-timeout)"
    except Exception as exc:   # every client raises its own types (httpx, aiohttp, botocore)
        why = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    hint = ""
    if url.startswith("hf://"):
        hint = ("; the Hugging Face Hub cannot be reached (or HF_HUB_OFFLINE is set): download the dataset "
                "where the Hub is reachable and pass the local copy")
    raise ConfigError(f"cannot read input {url}: {why}{hint}") from None


def open_inputs(urls: list, input_format: str | None, storage_options: dict | None = None,
                timeout: float = 60.0) -> list[InputSource]:
    """Resolve each input's format (config errors raised here, before any work).

    An input is a URL, or a `datasets.Dataset` / `IterableDataset` (its rows given to `iter_rows` by
    ingest.hf_datasets.dataset_inputs; relative image paths resolve against the current directory unless
    the access policy has an image root). Remote inputs must answer within `timeout` seconds.
    """
    if not urls:
        raise ConfigError("no input given")
    shards = [u for u in urls if isinstance(u, str) and is_shard_name(u)]
    if shards:
        raise index_instead(shards)
    out = []
    for url in urls:
        if is_dataset_object(url):
            out.append(InputSource(url=dataset_label(url), format=HF_DATASET_FORMAT, base=os.getcwd()))
            continue
        if not isinstance(url, str):
            raise ConfigError(f"input of type {type(url).__name__}: pass a path or URL, or a datasets.Dataset / "
                              "IterableDataset (of a DatasetDict, one split: ds['train'])")
        url, fmt = _resolve_reachable(url, input_format, storage_options, timeout)
        if fmt == "parquet":
            check_parquet(url, storage_options or {})
        base = url if fmt in ("folder", HF_DATASET_FORMAT) else _dirname(url)
        out.append(InputSource(url=url, format=fmt, base=base))
    return out


def iter_rows(sources: list[InputSource], storage_options: dict | None = None,
              given: dict[int, tuple[Iterator[dict], bool]] | None = None) -> Iterator[Row]:
    """All rows of all inputs, in order. `given` maps a source's number to its rows and whether they are
    partial (id columns only; see ingest.hf_datasets.dataset_inputs), for inputs not read from their URL."""
    for i, src in enumerate(sources):
        items, partial = (given or {}).get(i) or (_READERS[src.format](src.url, storage_options or {}), False)
        for number, item in enumerate(items):
            if isinstance(item, dict):
                yield Row(i, number, item, partial=partial)
            else:
                yield Row(i, number, None, error=str(item))


def _open_binary(url: str, so: dict):
    """Local files with plain open() (works on pipes too), others through fsspec."""
    if fsutil.is_local(url):
        return open(fsutil.local_path(url), "rb")
    return fsutil.open_url(url, "rb", so)


_BadRow = BadRow


def _read_jsonl(url: str, so: dict) -> Iterator[dict | _BadRow]:
    with _open_binary(url, so) as raw:
        f = raw if isinstance(raw, io.BufferedIOBase) else io.BufferedReader(raw)   # readline(limit) everywhere
        line_no = 0
        while True:
            line = f.readline(MAX_ITEM_CHARS + 1)
            if not line:
                return
            line_no += 1
            if len(line) > MAX_ITEM_CHARS and not line.endswith(b"\n"):
                while (more := f.readline(MAX_ITEM_CHARS + 1)) and not more.endswith(b"\n"):
                    pass   # the rest of an overlong line is read past, never held
                yield _BadRow(f"line {line_no}: longer than {MAX_ITEM_CHARS} bytes")
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as exc:   # syntax, bad UTF-8, 4300-digit ints, deep nesting
                yield _BadRow(f"line {line_no}: {type(exc).__name__}: {str(exc)[:160]}")
                continue
            yield obj if isinstance(obj, dict) else _BadRow(f"line {line_no}: not a JSON object")


def _read_json(url: str, so: dict) -> Iterator[dict | _BadRow]:
    with _open_binary(url, so) as f:
        yield from iter_json_array(f)


def _read_csv(url: str, so: dict) -> Iterator[dict | _BadRow]:
    delimiter = "\t" if url.lower().endswith(".tsv") else ","
    with _open_binary(url, so) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
        yield from iter_csv_rows(text, delimiter)


def check_parquet(url: str, so: dict) -> None:
    """ConfigError naming the file when its Parquet footer cannot be read (truncated, not Parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with _open_binary(url, so) as f:
            rows = pq.ParquetFile(f).metadata.num_rows   # reads and parses the footer
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ConfigError(f"input {url} is not a readable Parquet file ({type(exc).__name__}: {str(exc)[:200]}); "
                          "it may be truncated or not Parquet: re-export it, or leave it out of the inputs") from None
    if rows < 0:
        raise ConfigError(f"input {url}: its Parquet footer declares {rows} rows")


def _read_parquet(url: str, so: dict) -> Iterator[dict | _BadRow]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with _open_binary(url, so) as f:
        pf = pq.ParquetFile(f)
        for group in range(pf.num_row_groups):
            rows, done = pf.metadata.row_group(group).num_rows, 0
            try:
                for batch in pf.iter_batches(batch_size=1024, row_groups=[group]):
                    out = batch.to_pylist()
                    done += len(out)
                    yield from out
            except (pa.ArrowException, OSError, ValueError) as exc:   # every row of the group is counted
                why = f"row group {group} of {url} cannot be read: {type(exc).__name__}: {str(exc)[:160]}"
                for _ in range(max(0, rows - done)):
                    yield _BadRow(why)


def _read_folder(url: str, so: dict) -> Iterator[dict | _BadRow]:
    fs, root = url_to_fs(url, **so)
    root = root.rstrip("/")
    files = sorted(fs.find(root))
    names = set(files)
    for path in files:
        stem, ext = os.path.splitext(path)
        kind = "image" if ext.lower() in IMAGE_EXTS else "video" if ext.lower() in CLIP_EXTS else None
        if kind is None:
            continue
        rel = path[len(root) + 1:]
        sidecar = stem + ".txt"
        yield {"id": os.path.splitext(rel)[0], kind: rel,
               "caption_file": sidecar[len(root) + 1:] if sidecar in names else None}


_READERS = {"json": _read_json, "jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet,
            "folder": _read_folder, HF_DATASET_FORMAT: read_saved_dataset}
