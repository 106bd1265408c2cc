"""Fetching whole shards from any fsspec URL, verified, with retries.

`ShardRef` names a shard and what its bytes must look like; `DirectFetcher`
is the no-cache path (and the object-store tier of the tiered cache): it
reads the object, retries transient errors with exponential backoff and
jitter, and verifies size and CRC32 before returning (`get`), or streams it
into a file (`fetch_to`, used by the SSD tier).
"""
from __future__ import annotations

import logging
import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol, TypeVar

from vlmdata import fsutil
from vlmdata.cache.local_shards import map_local_shard
from vlmdata.errors import CorruptShardError, FetchError

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class ShardRef:
    """A shard to fetch: its URL, recorded size and CRC32 (None = not checked), and a cache key."""

    url: str
    size: int | None = None
    crc32: int | None = None
    key: str = ""

    @property
    def cache_key(self) -> str:
        return self.key or self.url


def verify(data, ref: ShardRef) -> None:
    """Raise CorruptShardError unless `data` has the recorded size and CRC32."""
    if ref.size is not None and len(data) != ref.size:
        raise CorruptShardError(f"{ref.url}: {len(data)} bytes, expected {ref.size}")
    if ref.crc32 is not None:
        crc = zlib.crc32(data) & 0xFFFFFFFF
        if crc != ref.crc32:
            raise CorruptShardError(f"{ref.url}: crc32 {crc:#010x}, expected {ref.crc32:#010x}")


@dataclass
class RetryPolicy:
    """Exponential backoff with full jitter."""

    attempts: int = 4
    base_delay: float = 0.2
    max_delay: float = 5.0
    seed: int | None = None
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def delay(self, attempt: int) -> float:
        return self._rng.uniform(0, min(self.max_delay, self.base_delay * (2 ** attempt)))


class ShardFetcher(Protocol):
    """What the dataset needs from a cache: the verified bytes of a shard."""

    def get(self, ref: ShardRef):
        """Bytes-like object (bytes, memoryview or mmap) holding the whole shard."""

    def plan_ahead(self, refs: list[ShardRef]) -> None:
        """The shards that will be read next, in order (may be ignored)."""


class DirectFetcher:
    """Reads shards straight from their URLs (no cache), verified, with retries."""

    whole_object_bytes = 64 << 20   # fetch_to: objects up to this size are read with one request
    chunk_bytes = 16 << 20          # fetch_to: read size when streaming larger objects

    def __init__(self, storage_options: dict | None = None, retry: RetryPolicy | None = None):
        self.storage_options = storage_options or {}
        self.retry = retry or RetryPolicy()

    def get(self, ref: ShardRef) -> bytes:
        """The verified bytes: a read-only mmap for a local file, else bytes read from the store."""
        return self._with_retries(ref, lambda: self._get_once(ref))

    def _get_once(self, ref: ShardRef) -> bytes:
        if fsutil.is_local(ref.url):                # mapped, CRC checked once (cache/local_shards.py)
            return map_local_shard(fsutil.local_path(ref.url), ref.size, ref.crc32, ref.url)
        # an open-ended range read is one GET on object stores (a plain cat_file may HEAD first)
        data = fsutil.read_range(ref.url, 0, None, self.storage_options)
        verify(data, ref)
        return data

    def fetch_to(self, ref: ShardRef, f: BinaryIO) -> tuple[int, int]:
        """Write the shard's verified bytes to the seekable file `f`; return (size, crc32).

        Objects up to `whole_object_bytes` (or of unknown size) are read with one request; larger
        ones are streamed in chunks, so memory stays bounded. A failed attempt truncates `f` and
        starts over; a size/CRC mismatch counts as a failed attempt.
        """
        return self._with_retries(ref, lambda: self._fetch_to_once(ref, f))

    def _fetch_to_once(self, ref: ShardRef, f: BinaryIO) -> tuple[int, int]:
        f.seek(0)
        f.truncate()
        if ref.size is None or ref.size <= self.whole_object_bytes:
            data = self._get_once(ref)
            f.write(data)
            return len(data), zlib.crc32(data) & 0xFFFFFFFF
        size, crc = 0, 0
        with fsutil.open_url(ref.url, "rb", self.storage_options) as src:
            while True:
                chunk = src.read(self.chunk_bytes)
                if not chunk:
                    break
                f.write(chunk)
                size += len(chunk)
                crc = zlib.crc32(chunk, crc)
        crc &= 0xFFFFFFFF
        if size != ref.size:
            raise CorruptShardError(f"{ref.url}: {size} bytes, expected {ref.size}")
        if ref.crc32 is not None and crc != ref.crc32:
            raise CorruptShardError(f"{ref.url}: crc32 {crc:#010x}, expected {ref.crc32:#010x}")
        return size, crc

    def _with_retries(self, ref: ShardRef, attempt_once: Callable[[], T]) -> T:
        last: Exception | None = None
        for attempt in range(self.retry.attempts):
            try:
                return attempt_once()
            except FileNotFoundError as exc:
                raise FetchError(f"{ref.url}: not found") from exc
            except Exception as exc:  # network errors come in many types across fsspec backends
                last = exc
                if attempt + 1 < self.retry.attempts:
                    delay = self.retry.delay(attempt)
                    log.warning("fetch %s failed (%s); retry %d in %.2fs", ref.url, exc, attempt + 1, delay)
                    time.sleep(delay)
        error = CorruptShardError if isinstance(last, CorruptShardError) else FetchError
        raise error(f"{ref.url}: failed after {self.retry.attempts} attempts: {last}") from last

    def plan_ahead(self, refs: list[ShardRef]) -> None:
        return None
