"""Fetching whole shards from any fsspec URL, verified, bounded, with retries.

`ShardRef` names a shard and what its bytes must look like; `DirectFetcher`
is the no-cache path (and the object-store tier of the tiered cache): it
reads the object through the one retry policy of remote reads
(`vlmdata.retry.RetryPolicy`: transient errors are retried up to a deadline),
and verifies size and CRC32 before returning (`get`), or streams it into a
file (`fetch_to`, used by the SSD tier). Reads are bounded: never more than the
declared size plus one byte (or `max_bytes` when no size is declared), so an
object larger than its declaration, or an endless one, is refused after
reading at most that much; local paths must be regular files.
"""
from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO, Protocol, TypeVar

from vlmdata import fsutil
from vlmdata.cache.local_shards import map_local_shard
from vlmdata.errors import CorruptShardError, FetchError
from vlmdata.retry import RetryPolicy

__all__ = ["DirectFetcher", "RetryPolicy", "ShardFetcher", "ShardRef", "verify"]

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


class ShardFetcher(Protocol):
    """What the dataset needs from a cache: the verified bytes of a shard."""

    def get(self, ref: ShardRef):
        """Bytes-like object (bytes, memoryview or mmap) holding the whole shard."""

    def plan_ahead(self, refs: list[ShardRef]) -> None:
        """The shards that will be read next, in order (may be ignored)."""


class DirectFetcher:
    """Reads shards straight from their URLs (no cache), verified, bounded, with retries.

    max_bytes: the most bytes read for a ref without a declared size (None: no limit); the tiered
    cache sets it to its budget.
    """

    whole_object_bytes = 64 << 20   # fetch_to: objects up to this size are read with one request
    chunk_bytes = 16 << 20          # fetch_to: read size when streaming larger objects

    def __init__(self, storage_options: dict | None = None, retry: RetryPolicy | None = None,
                 max_bytes: int | None = None):
        self.storage_options = storage_options or {}
        self.retry = retry or RetryPolicy()
        self.max_bytes = max_bytes

    def get(self, ref: ShardRef) -> bytes:
        """The verified bytes: a read-only mmap for a local file, else bytes read from the store."""
        return self._with_retries(ref, lambda: self._get_once(ref))

    def _limit(self, ref: ShardRef) -> int | None:
        return ref.size if ref.size is not None else self.max_bytes

    def _too_large(self, ref: ShardRef, got: int) -> Exception:
        if ref.size is not None:
            return CorruptShardError(f"{ref.url}: more than its declared {ref.size} bytes (read {got})")
        return FetchError(f"{ref.url}: larger than the {self.max_bytes}-byte limit of this cache")

    def _get_once(self, ref: ShardRef) -> bytes:
        fsutil.check_regular_file(ref.url)
        limit = self._limit(ref)
        if fsutil.is_local(ref.url):                # mapped, not read; CRC checked once (cache/local_shards.py)
            path = fsutil.local_path(ref.url)
            got = os.path.getsize(path)
            if limit is not None and got > limit:
                raise self._too_large(ref, got)
            return map_local_shard(path, ref.size, ref.crc32, ref.url)
        # a range read is one GET on object stores (a plain cat_file may HEAD first); it stops one byte past
        # the limit, so a larger (or endless) object is refused after reading at most limit + 1 bytes
        if limit == 0:  # an empty range is an error on object stores: ask for the size instead
            got = fsutil.size(ref.url, self.storage_options)
            if got:
                raise self._too_large(ref, got)
            return b""
        data = fsutil.read_range(ref.url, 0, None if limit is None else limit + 1, self.storage_options)
        if limit is not None and len(data) > limit:
            raise self._too_large(ref, len(data))
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
        limit = self._limit(ref)
        if limit is None or limit <= self.whole_object_bytes:
            data = self._get_once(ref)
            f.write(data)
            return len(data), zlib.crc32(data) & 0xFFFFFFFF
        fsutil.check_regular_file(ref.url)
        size, crc = 0, 0
        with fsutil.open_url(ref.url, "rb", self.storage_options) as src:
            while size <= limit:
                chunk = src.read(min(self.chunk_bytes, limit + 1 - size))
                if not chunk:
                    break
                f.write(chunk)
                size += len(chunk)
                crc = zlib.crc32(chunk, crc)
        crc &= 0xFFFFFFFF
        if size > limit:
            raise self._too_large(ref, size)
        if ref.size is not None and size != ref.size:
            raise CorruptShardError(f"{ref.url}: {size} bytes, expected {ref.size}")
        if ref.crc32 is not None and crc != ref.crc32:
            raise CorruptShardError(f"{ref.url}: crc32 {crc:#010x}, expected {ref.crc32:#010x}")
        return size, crc

    def _with_retries(self, ref: ShardRef, attempt_once: Callable[[], T]) -> T:
        """The retry policy around one attempt; every failure ends as a FetchError (or CorruptShardError)."""
        try:
            return self.retry.call(attempt_once, ref.url)
        except FetchError:
            raise
        except FileNotFoundError as exc:
            raise FetchError(f"{ref.url}: not found") from exc
        except Exception as exc:  # permanent: permission denied, bad URL, missing credentials, ...
            raise FetchError(f"{ref.url}: {type(exc).__name__}: {exc}") from exc

    def plan_ahead(self, refs: list[ShardRef]) -> None:
        return None
