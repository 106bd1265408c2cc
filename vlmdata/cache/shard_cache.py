"""The in-process tiered cache: memory -> local SSD -> object store, plan-driven.

`ShardCache` serves verified shard bytes through its tiers with single-flight fetching (one
fetch per key however many threads want it), evicts by the plan (Belady) or LRU, and runs a
prefetcher: background threads that walk the plan ahead within a bytes budget and fetch what is
missing, so the next window's shards are local before they are needed. It is used directly as
the ShardFetcher of one process (`TieredFetcher`) and, with several readers' plans, by the node
daemon (`get_path`).

Cache pressure never costs samples. An entry a reader asks for is pinned before it is loaded, so
nothing (another reader, the prefetcher) can evict it before the reader has mapped it; pinned entries
are never evicted. When what readers have pinned leaves no room for another entry in the SSD budget
(or an object is larger than the whole budget), `get_path` raises NoRoomError instead of overfilling
the disk, and the reader reads that shard directly (read through, counted as `read_through`). Reads
of objects without a declared size stop at the budget. A cache directory found over its budget (a
restart with a smaller one) is shrunk when the cache opens.
"""
from __future__ import annotations

import logging
import threading
from collections import Counter
from concurrent.futures import Future
from queue import SimpleQueue

from vlmdata.cache.eviction import PlanBook, choose_victims, planned_keys
from vlmdata.cache.fetch import DirectFetcher, ShardRef
from vlmdata.cache.keys import key_for
from vlmdata.cache.stats import CacheStats
from vlmdata.cache.tiers import DiskTier, MemoryTier
from vlmdata.errors import FetchError, NoRoomError
from vlmdata.metrics.registry import MetricSet

log = logging.getLogger(__name__)

SCAN_LIMIT = 4096  # plan positions the prefetcher looks at per pass


class ShardCache:
    """Tiered, plan-aware shard cache shared by any number of readers (threads or connections).

    `config` is a CacheConfig; `disk_dir`/`disk_bytes` override its SSD tier (None = use config).
    """

    def __init__(self, config, metrics: MetricSet | None = None, disk_dir: str | None = None,
                 disk_bytes: int | None = None):
        if config.policy not in ("belady", "lru"):
            raise ValueError(f"unknown cache policy {config.policy!r}: use 'belady' or 'lru'")
        self.policy = config.policy
        self.remote = DirectFetcher(config.storage_options, config.retry)
        self.mem = MemoryTier(config.memory_bytes) if config.memory_bytes > 0 else None
        ddir = disk_dir if disk_dir is not None else config.disk_dir
        dbytes = disk_bytes if disk_bytes is not None else config.disk_bytes
        self.disk = DiskTier(ddir, dbytes) if ddir and dbytes > 0 else None
        if self.disk is not None:
            self.remote.max_bytes = self.disk.budget   # an object of undeclared size is read up to the budget
        self.stats = CacheStats(metrics)
        self.plans = PlanBook()
        self.refs: dict[str, ShardRef] = {}
        self._lock = threading.RLock()
        self._inflight: dict[str, Future] = {}
        self._pins: Counter = Counter()
        self._pin_sizes: dict[str, int] = {}         # bytes each pinned key holds (or will hold) in the SSD tier
        self._queued: set[str] = set()
        self._failed: set[str] = set()
        self._queue: SimpleQueue = SimpleQueue()
        self.prefetch_bytes = int(config.prefetch_bytes) if (self.mem or self.disk) else 0
        self._threads: list[threading.Thread] = []
        self._nthreads = max(1, int(config.prefetch_threads))
        self._closed = False
        if self.disk is not None:
            if self.disk.used > self.disk.budget:      # reopened with a smaller budget: shrink now
                found = self.disk.used
                with self._lock:
                    self._shrink(self.disk)
                log.info("disk cache %s: %d bytes found over the %d-byte budget; evicted the least recently "
                         "used down to %d bytes", self.disk.root, found, self.disk.budget, self.disk.used)
            self.stats.set_bytes("disk", self.disk.used)

    # -- public -------------------------------------------------------------------------------
    def plan(self, reader, refs: list[ShardRef]) -> None:
        """Replace `reader`'s future accesses with `refs` (in order, repeats included)."""
        refs, keys = planned_keys(refs)
        with self._lock:
            for k, r in zip(keys, refs):
                self.refs[k] = r
            self.plans.set(reader, keys)
            self._failed.clear()
            self._start_prefetch()
            self._kick()

    def drop_reader(self, reader) -> None:
        with self._lock:
            self.plans.drop(reader)

    def get(self, ref: ShardRef, reader=0):
        """Verified bytes of the shard (bytes or a read-only mmap); raises FetchError."""
        key = key_for(ref)
        with self._lock:
            self.plans.consume(reader, key)
            self._failed.discard(key)
            if self.mem is not None:
                value = self.mem.get(key)
                if value is not None:
                    self.stats.hit("memory", len(value))
                    self._kick()
                    return value
                self.stats.miss("memory")
        value = self._load(ref, key, prefetch=False)
        with self._lock:
            if self.mem is not None and key not in self.mem:
                self.mem.put(key, value)
                self._shrink(self.mem, new_key=key, protect=True)
                self.stats.set_bytes("memory", self.mem.used)
            self._kick()
        return value

    def get_path(self, ref: ShardRef, reader) -> tuple[str, int]:
        """Ensure the shard is in the SSD tier and pin it; (path, size). Release with `unpin`."""
        if self.disk is None:
            raise RuntimeError("get_path needs an SSD tier")
        key = key_for(ref)
        with self._lock:
            self.plans.consume(reader, key)
            self._failed.discard(key)
            if not self._room_for(key, ref.size):
                self.stats.count("read_through")
                raise NoRoomError(f"{ref.url}: the SSD budget ({self.disk.budget} bytes) is held by entries readers "
                                  "have pinned; read it directly")
            self._pins[key] += 1          # pinned before it is loaded: nothing evicts it before the reader maps it
            self._pin_sizes.setdefault(key, ref.size or 0)
        try:
            self._load(ref, key, prefetch=False, protect=True)
            with self._lock:
                e = self.disk.entries.get(key)
                if e is None:             # not written to the SSD (write failed): the reader reads it directly
                    self.stats.count("read_through")
                    raise NoRoomError(f"{ref.url}: could not be kept in the SSD tier; read it directly")
                self._pin_sizes[key] = e.size
                self._kick()
                return self.disk.path(key), e.size
        except BaseException:
            self.unpin(key)
            raise

    def _room_for(self, key: str, size: int | None) -> bool:
        """Whether the SSD budget can hold `key` beside every other pinned entry (caller holds the lock)."""
        if key in self.disk.entries or key in self._pins or size is None:
            return True
        pinned = sum(self._pin_sizes.get(k, 0) for k in self._pins)
        return pinned + size <= self.disk.budget

    def unpin(self, key: str) -> None:
        with self._lock:
            self._pins[key] -= 1
            if self._pins[key] <= 0:
                del self._pins[key]
                self._pin_sizes.pop(key, None)
            if self.disk is not None:
                self._shrink(self.disk)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._threads:
                self._queue.put(None)
        for t in self._threads:
            t.join(timeout=30)
        if self.disk is not None:
            self.disk.close()

    # -- loading (single-flight) ----------------------------------------------------------------
    def _load(self, ref: ShardRef, key: str, prefetch: bool, protect: bool = False):
        with self._lock:
            fut = self._inflight.get(key)
            owner = fut is None
            if owner:
                fut = Future()
                self._inflight[key] = fut
        if not owner:
            if not prefetch:
                self.stats.count("joined")
            return fut.result()
        try:
            value = self._load_owner(ref, key, prefetch, protect)
            fut.set_result(value)
            return value
        except BaseException as exc:
            fut.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._inflight.pop(key, None)

    def _load_owner(self, ref: ShardRef, key: str, prefetch: bool, protect: bool):
        if self.disk is not None:
            value = self._from_disk(ref, key)
            if value is not None:
                if not prefetch:
                    self.stats.hit("disk", len(value))
                return value
            if not prefetch:
                self.stats.miss("disk")
        self.stats.set_inflight(+1)
        try:
            value, entry = self._from_remote(ref, key)
        except FetchError:
            self.stats.count("fetch_errors")
            if not prefetch:
                self.stats.miss("remote")
            raise
        finally:
            self.stats.set_inflight(-1)
        self.stats.fetched(len(value), prefetch)
        if not prefetch:
            self.stats.hit("remote", len(value))
        with self._lock:
            if entry is not None:
                self.disk.insert(key, entry)
                self._shrink(self.disk, new_key=key, protect=protect or not prefetch)
                self.stats.set_bytes("disk", self.disk.used)
            elif prefetch and self.mem is not None:
                self.mem.put(key, value)
                self._shrink(self.mem, new_key=key)
        return value

    def _from_disk(self, ref: ShardRef, key: str):
        with self._lock:
            entry = self.disk.lookup(key, ref.size, ref.crc32)
        if entry is None:
            return None
        value = self.disk.open_entry(key, entry)
        with self._lock:
            if value is None:
                if self.disk.entries.get(key) is entry:
                    self.disk.remove(key)
                    self.stats.count("corrupt_discarded")
                return None
            self.disk.mark_verified(key, entry)
        return value

    def _from_remote(self, ref: ShardRef, key: str):
        if self.disk is None or (ref.size is not None and ref.size > self.disk.budget):
            return self.remote.get(ref), None     # no SSD tier, or larger than all of it: serve from memory
        try:
            return self.disk.write(key, lambda f: self.remote.fetch_to(ref, f))
        except FetchError:
            raise
        except OSError as exc:  # SSD full or failing: serve from memory, do not fail the read
            log.warning("SSD cache write for %s failed (%s); serving without caching", ref.url, exc)
            return self.remote.get(ref), None

    # -- eviction -------------------------------------------------------------------------------
    def _shrink(self, tier, new_key: str | None = None, protect: bool = False) -> None:
        """Evict from `tier` until it fits its budget; pinned keys (and a protected new key) stay.

        A key a reader just asked for is always admitted (`protect`): it is in use now and the
        reader may read it again (plans list shard visits, not every read). A prefetched key
        competes with the residents, so Belady drops it at once if everything else is needed sooner.
        """
        need = tier.used - tier.budget
        if need <= 0:
            return
        skip = set(self._pins) if tier is self.disk else set()
        if protect and new_key is not None:
            skip.add(new_key)
        cands = [k for k in tier.entries if k not in skip]
        sizes = tier.sizes
        for victim in choose_victims(cands, sizes, need, self.policy, self.plans):
            tier.remove(victim)
            self.stats.evicted(tier.name)

    # -- prefetch -------------------------------------------------------------------------------
    def _resident(self, key: str) -> bool:
        return (self.mem is not None and key in self.mem) or (self.disk is not None and key in self.disk)

    def _would_admit(self, key: str, size: int) -> bool:
        tier = self.disk if self.disk is not None else self.mem
        free = tier.budget - tier.used
        if free >= size:
            return True
        if self.policy == "lru":
            return size <= tier.budget
        nu = self.plans.next_use(key)
        sizes = tier.sizes
        reclaim = sum(sizes[k] for k in tier.entries if k not in self._pins and self.plans.next_use(k) > nu)
        return free + reclaim >= size

    def _start_prefetch(self) -> None:
        if self.prefetch_bytes <= 0 or self._threads or self._closed:
            return
        for i in range(self._nthreads):
            t = threading.Thread(target=self._prefetch_worker, name=f"vlmdata-prefetch-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def _kick(self) -> None:
        """Queue fetches for the upcoming keys that are missing (caller holds the lock)."""
        if self.prefetch_bytes <= 0 or self._closed or not self.plans.plans:
            return
        budget = self.prefetch_bytes
        seen: set[str] = set()
        lead, leading = 0, True
        for n, (_, key) in enumerate(self.plans.upcoming()):
            if n >= SCAN_LIMIT:
                break
            if key in seen:
                continue
            seen.add(key)
            ref = self.refs.get(key)
            size = ref.size if ref is not None and ref.size is not None else 0
            resident = self._resident(key)
            if leading:
                if resident:
                    lead += 1
                else:
                    leading = False
            if len(seen) > 1 and budget - size < 0:
                break
            budget -= size
            if resident or ref is None or key in self._inflight or key in self._queued or key in self._failed:
                continue
            if not self._would_admit(key, size):
                break  # everything further is needed even later: Belady would not keep it
            self._queued.add(key)
            self._queue.put(ref)
        self.stats.set_lead(lead)

    def _prefetch_worker(self) -> None:
        while True:
            ref = self._queue.get()
            if ref is None:
                return
            key = key_for(ref)
            try:
                with self._lock:
                    wanted = not self._closed and not self._resident(key)
                if wanted:
                    self._load(ref, key, prefetch=True)
            except FetchError as exc:
                log.warning("prefetch of %s failed: %s (the reader will retry)", ref.url, exc)
                with self._lock:
                    self._failed.add(key)
            except OSError as exc:
                log.warning("prefetch of %s failed: %s", ref.url, exc)
                with self._lock:
                    self._failed.add(key)
            finally:
                with self._lock:
                    self._queued.discard(key)
                    self._kick()


class TieredFetcher:
    """ShardFetcher of one process: `plan_ahead` + `get` over a ShardCache (one reader)."""

    def __init__(self, cache: ShardCache):
        self.cache = cache

    def plan_ahead(self, refs: list[ShardRef]) -> None:
        """Replace the future access sequence (pass everything known, e.g. the epoch's rest)."""
        self.cache.plan(0, list(refs))

    def get(self, ref: ShardRef):
        return self.cache.get(ref, 0)

    def stats(self) -> dict:
        return self.cache.stats.to_dict()

    def take_stats(self):
        """Cache counts since the last call (a StatsDelta; see CacheStats.take)."""
        return self.cache.stats.take()

    def close(self) -> None:
        self.cache.close()
