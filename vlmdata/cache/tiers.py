"""Cache tiers: memory (bytes budget) and local SSD (files in a cache directory, bytes budget).

Both tiers are plain bookkeeping plus storage; they are not thread-safe on their own (the
`ShardCache` lock guards them) and never choose victims themselves (the cache asks the policy).

SSD layout, crash-safe by construction::

    <dir>/                   mode 0700, refused when another user owns it or can write it (fsutil)
    <dir>/.lock              flock held by the one process that owns the directory
    <dir>/<sha>.meta         {"key", "size", "crc32"}: written (temp + fsync + rename) first
    <dir>/<sha>.data         the shard bytes: written to .tmp-*, fsynced, renamed into place
    <dir>/.tmp-*             in-progress writes; deleted on open (a crash leaves only these)

A .data file exists only once it is complete, so a kill -9 mid-write leaves a temp file, never a
torn entry. Verification cost choice: bytes fetched in this process were verified (size + CRC32)
while streaming them to disk, so they are trusted; entries found on disk when the tier opens are
unverified and get one full CRC32 pass on their first use (not on every read, which would cost a
full extra pass per read, and not at start-up, which would delay start by reading the whole SSD).
An entry that fails is deleted and fetched again, never served.
"""
from __future__ import annotations

import fcntl
import json
import logging
import mmap
import os
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from vlmdata.cache.disk_scan import scan_cache_dir
from vlmdata.cache.keys import entry_name
from vlmdata.cache.verified import VERIFIED, file_identity
from vlmdata.errors import CacheDirBusy
from vlmdata.fsutil import open_private, private_dir

log = logging.getLogger(__name__)

CHUNK = 8 << 20


class MemoryTier:
    """Shard bytes held in process memory, within a bytes budget."""

    name = "memory"

    def __init__(self, budget: int):
        self.budget = int(budget)
        self.entries: OrderedDict[str, object] = OrderedDict()  # LRU order, oldest first
        self.sizes: dict[str, int] = {}
        self.used = 0

    def get(self, key: str):
        value = self.entries.get(key)
        if value is not None:
            self.entries.move_to_end(key)
        return value

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def put(self, key: str, value) -> None:
        if key in self.entries:
            self.remove(key)
        self.entries[key] = value
        self.sizes[key] = len(value)
        self.used += len(value)

    def remove(self, key: str) -> None:
        if key in self.entries:
            del self.entries[key]
            self.used -= self.sizes.pop(key)


@dataclass
class DiskEntry:
    name: str
    size: int
    crc32: int
    verified: bool


def map_file(path: str):
    """A read-only mmap of a whole file (b"" for an empty one); survives the file's unlink."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DiskTier:
    """Verified shard files in a cache directory, within a bytes budget."""

    name = "disk"

    def __init__(self, root: str, budget: int):
        self.root = private_dir(root)  # cached shards are private to the cache's user (refused otherwise)
        self.budget = int(budget)
        self._lock_fd = open_private(self.root, ".lock", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise CacheDirBusy(f"cache directory {self.root} is in use by another process "
                               "(one daemon per cache directory; give each process its own)") from None
        self.entries: OrderedDict[str, DiskEntry] = OrderedDict()  # LRU order
        self.used = 0
        self.discarded = 0
        self._scan()

    # -- start-up ---------------------------------------------------------------------------
    def _scan(self) -> None:
        found, _ = scan_cache_dir(self.root)  # tolerant: leftovers removed, foreign items left alone
        for f in found:
            self.entries[f.key] = DiskEntry(f.stem, f.size, f.crc32, verified=False)
            self.used += f.size
        if found:
            log.info("disk cache %s: %d entries (%d bytes) found, verified on first use",
                     self.root, len(found), self.used)

    # -- lookups ----------------------------------------------------------------------------
    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def path(self, key: str) -> str:
        return os.path.join(self.root, entry_name(key) + ".data")

    def lookup(self, key: str, size: int | None, crc32: int | None) -> DiskEntry | None:
        """The entry for `key` if it matches the expected size/CRC (a stale entry is dropped)."""
        e = self.entries.get(key)
        if e is None:
            return None
        if (size is not None and e.size != size) or (crc32 is not None and e.crc32 != crc32):
            self.remove(key)
            self.discarded += 1
            return None
        self.entries.move_to_end(key)
        return e

    def open_entry(self, key: str, e: DiskEntry):
        """mmap the entry; for an unverified one, check size and CRC32 first. None if bad or gone.

        An entry another process of this tree already checked (`cache.verified`) is not read again."""
        path = os.path.join(self.root, e.name + ".data")
        try:
            data = map_file(path)
            ident = file_identity(path, os.stat(path), e.crc32)
        except FileNotFoundError:
            return None
        if not e.verified and ident not in VERIFIED:
            if len(data) != e.size or (zlib.crc32(data) & 0xFFFFFFFF) != e.crc32:
                log.warning("disk cache entry for %s is corrupt (torn or damaged); discarding it", key)
                return None
            VERIFIED.add(ident)
        return data

    def mark_verified(self, key: str, e: DiskEntry) -> None:
        if self.entries.get(key) is e:
            e.verified = True

    # -- writes -----------------------------------------------------------------------------
    def write(self, key: str, fill: Callable[[BinaryIO], tuple[int, int]]):
        """Write an entry: `fill(f)` writes the verified bytes and returns (size, crc32).

        Temp file + fsync + rename; the meta (key, size, crc32) is published first. Returns an mmap
        of the final file. Call `insert` afterwards (under the cache lock) to account for it.
        """
        stem = entry_name(key)
        data_path = os.path.join(self.root, stem + ".data")
        tmp = os.path.join(self.root, f".tmp-{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb+") as f:
                size, crc = fill(f)
                f.flush()
                os.fsync(f.fileno())
            meta_tmp = os.path.join(self.root, f".tmp-{uuid.uuid4().hex}")
            with open(meta_tmp, "wb") as f:
                f.write(json.dumps({"key": key, "size": size, "crc32": crc}).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(meta_tmp, os.path.join(self.root, stem + ".meta"))
            os.replace(tmp, data_path)
            _fsync_dir(self.root)
        finally:
            for p in (tmp, locals().get("meta_tmp")):
                if p and os.path.exists(p):
                    os.unlink(p)
        VERIFIED.add(file_identity(data_path, os.stat(data_path), crc))   # checked while it was written
        return map_file(data_path), DiskEntry(stem, size, crc, verified=True)

    def insert(self, key: str, e: DiskEntry) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            self.used -= old.size
        self.entries[key] = e
        self.used += e.size

    def remove(self, key: str) -> None:
        e = self.entries.pop(key, None)
        if e is not None:
            self.used -= e.size
            self._unlink(e.name)

    def _unlink(self, stem: str) -> None:
        for ext in (".data", ".meta"):
            try:
                os.unlink(os.path.join(self.root, stem + ext))
            except FileNotFoundError:
                pass

    @property
    def sizes(self) -> dict[str, int]:
        return {k: e.size for k, e in self.entries.items()}

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1
