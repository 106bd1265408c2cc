"""WebDataset / img2dataset tars given to `vlmdata shard`: refused, naming the `vlmdata index` command.

Tars written by other tools are already shards: `vlmdata index DIR` indexes them in place (no copy, see
ingest.index_foreign). `vlmdata shard` reads raw rows, so given a tar, a brace or glob pattern of tars
(`data/{00000..00009}.tar`, `data/*.tar`) or a folder of tars (a folder holding a table of its own
beside a tar, e.g. `data.jsonl` and `images.tar`, is read as that table), it stops before any work with one
line that names the exact command to run on the user's own folder(s).
"""
from __future__ import annotations

import shlex

from vlmdata.errors import ConfigError

__all__ = ["SHARD_SUFFIXES", "index_instead", "is_shard_folder", "is_shard_name"]

SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")     # what `vlmdata index` indexes
_PATTERN_CHARS = "{*?["


def is_shard_name(url: str) -> bool:
    """True for a .tar / .tar.gz / .tgz file name or a brace / glob pattern of them."""
    return url.lower().rstrip("/").endswith(SHARD_SUFFIXES)


def _stem(path: str) -> str:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    for suffix in (*SHARD_SUFFIXES, ".parquet", ".jsonl", ".json", ".csv", ".tsv", ".ndjson"):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def is_shard_folder(fs, path: str, tables: list[str]) -> bool:
    """True when a directory holds tar shards directly (img2dataset and webdataset write them flat) and
    no table of its own: img2dataset's per-shard `NNNNN.parquet` beside `NNNNN.tar` is not one."""
    shards = {_stem(p) for p in fs.ls(path, detail=False) if is_shard_name(p)}
    return bool(shards) and all(_stem(t) in shards for t in tables)


def _folder_of(url: str, is_dir: bool) -> str:
    """The folder `vlmdata index` should be given: the directory itself, else the part of the path before
    its first pattern component, without the file name."""
    parts = url.rstrip("/").split("/")
    for i, part in enumerate(parts):
        if any(c in part for c in _PATTERN_CHARS):
            parts = parts[:i + 1]
            break
    if not is_dir:
        parts = parts[:-1]
    return "/".join(parts) or "."


def index_instead(urls: list[str], directories: set[str] = frozenset()) -> ConfigError:
    """The one-line error for tar inputs (`directories`: those of `urls` that are folders)."""
    folders = list(dict.fromkeys(_folder_of(u, u in directories) for u in urls))
    commands = " and ".join(f"`vlmdata index {shlex.quote(f)}`" for f in folders)
    named = ", ".join(urls[:3]) + (f" and {len(urls) - 3} more" if len(urls) > 3 else "")
    return ConfigError(f"{named}: WebDataset tar shards (img2dataset, webdataset), not raw rows; index them "
                       f"in place with {commands} (it indexes every .tar / .tar.gz under the folder and writes "
                       "the manifest there), then load that folder")
