"""What an SSD cache directory holds when the cache opens: our entries, our leftovers, and what is not ours.

The SSD tier's files (see `tiers.DiskTier`) are `<40 hex>.meta` + `<40 hex>.data` pairs, `.tmp-*`
files of interrupted writes and the `.lock` file. `scan_cache_dir` walks the directory once, without
following symlinks, and:

- returns the valid entries (a regular `.meta` naming its key, size and CRC32, beside a regular
  `.data`), oldest first; their bytes are verified on first use (`DiskTier.open_entry`);
- deletes our own leftovers: interrupted `.tmp-*` files, a `.meta` without its `.data` (a crash between
  the two renames), a `.data` without its `.meta`, and pairs whose `.meta` is invalid or names another
  key (each file at most once; one already gone is fine);
- logs and leaves alone everything that is not ours: directories (even when named like an entry),
  symlinks, devices, files with other names. Nothing there stops the cache from starting, and a stray
  file is never served.
"""
from __future__ import annotations

import json
import logging
import os
import re
import stat
from dataclasses import dataclass

from vlmdata.cache.keys import entry_name
from vlmdata.errors import BadKeyError

__all__ = ["FoundEntry", "scan_cache_dir"]

log = logging.getLogger(__name__)

_ENTRY = re.compile(r"^([0-9a-f]{40})\.(meta|data)$")


@dataclass
class FoundEntry:
    """A valid entry found on disk (unverified: its CRC32 is checked on first use)."""

    key: str
    stem: str
    size: int
    crc32: int
    mtime: float


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _read_meta(path: str) -> tuple[str, int, int] | None:
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read(1 << 16))
        key, size, crc = meta["key"], int(meta["size"]), int(meta["crc32"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (key, size, crc) if isinstance(key, str) and size >= 0 and 0 <= crc <= 0xFFFFFFFF else None


def scan_cache_dir(root: str) -> tuple[list[FoundEntry], int]:
    """(valid entries oldest first, number of leftover files deleted); see the module docstring."""
    metas: dict[str, os.stat_result] = {}
    datas: dict[str, os.stat_result] = {}
    foreign: list[str] = []
    removed = 0
    for name in os.listdir(root):
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        regular = stat.S_ISREG(st.st_mode)
        if name == ".lock":
            continue
        if name.startswith(".tmp-") and regular:
            _unlink(path)                                  # an interrupted write
            removed += 1
            continue
        match = _ENTRY.match(name)
        if match is None or not regular:
            foreign.append(name)
            continue
        (metas if match.group(2) == "meta" else datas)[match.group(1)] = st
    found: list[FoundEntry] = []
    for stem in sorted(set(metas) | set(datas)):
        meta_path, data_path = (os.path.join(root, stem + ext) for ext in (".meta", ".data"))
        parsed = _read_meta(meta_path) if stem in metas and stem in datas else None
        ok = parsed is not None
        if ok:
            key, size, crc = parsed
            try:
                ok = entry_name(key) == stem
            except BadKeyError:
                ok = False
        if not ok:
            for p in ([meta_path] if stem in metas else []) + ([data_path] if stem in datas else []):
                _unlink(p)
                removed += 1
            continue
        found.append(FoundEntry(key, stem, size, crc, datas[stem].st_mtime))
    if foreign:
        log.warning("cache directory %s holds %d item(s) the cache did not write (e.g. %r); left alone",
                    root, len(foreign), sorted(foreign)[0])
    if removed:
        log.info("cache directory %s: removed %d leftover file(s) of interrupted or invalid entries", root, removed)
    found.sort(key=lambda e: e.mtime)
    return found, removed
