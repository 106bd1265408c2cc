"""`CacheConfig`: the picklable description of a cache, opened once per DataLoader worker."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from vlmdata.retry import RetryPolicy

log = logging.getLogger(__name__)


@dataclass
class CacheConfig:
    """How shards are cached. Pass it as `VLMDataset(cache=...)`; each worker calls `.open()`.

    memory_bytes: memory tier budget of each process that opens the config.
    disk_dir / disk_bytes: SSD tier. Without a daemon, each opening process gets its own
        sub-directory (`r<LOCAL_RANK>-w<worker id>`) and an equal share of disk_bytes, because one
        directory has one owner. With a daemon, disk_dir is unused by readers (the daemon has its own).
    policy: "belady" (evict what the plan needs farthest in the future) or "lru".
    prefetch_bytes: how far ahead (in bytes) the prefetcher walks the plan; 0 disables prefetch.
    prefetch_threads: concurrent background fetches.
    daemon: Unix socket path of the node's cache daemon, or "tcp://127.0.0.1:PORT"; None = no daemon.
        If the daemon is absent or dies, readers fetch directly (memory tier + prefetch) and
        reconnect later.
    daemon_token_file: the daemon's token file, needed over TCP (the daemon writes it 0600 beside
        its socket, or in its cache directory, and logs its path).
    storage_options: fsspec options for the object store (e.g. s3 endpoint_url, key, secret).
    retry: the retry policy of remote reads (vlmdata.retry.RetryPolicy: transient errors are retried
        up to its deadline, 5 minutes by default).
    """

    memory_bytes: int = 1 << 30
    disk_dir: str | None = None
    disk_bytes: int = 0
    policy: str = "belady"
    prefetch_bytes: int = 2 << 30
    prefetch_threads: int = 4
    daemon: str | None = None
    storage_options: dict = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    daemon_token_file: str | None = None

    def __post_init__(self) -> None:
        if self.policy not in ("belady", "lru"):
            raise ValueError(f"CacheConfig.policy must be 'belady' or 'lru', got {self.policy!r}")
        if min(self.memory_bytes, self.disk_bytes, self.prefetch_bytes) < 0:
            raise ValueError("CacheConfig byte budgets must be >= 0")
        if self.disk_bytes > 0 and not self.disk_dir:
            raise ValueError("CacheConfig.disk_bytes is set but disk_dir is not: give the SSD cache directory")

    def open(self, metrics=None):
        """A ShardFetcher for this process: a daemon client if `daemon` is set, else tiers in-process."""
        from vlmdata.cache.shard_cache import ShardCache, TieredFetcher

        if self.daemon:
            from vlmdata.cache.daemon.client import DaemonClient

            return DaemonClient(self)
        disk_dir, disk_bytes = self._process_disk_share()
        return TieredFetcher(ShardCache(self, metrics=metrics, disk_dir=disk_dir, disk_bytes=disk_bytes))

    def _process_disk_share(self) -> tuple[str | None, int]:
        if not self.disk_dir or self.disk_bytes <= 0:
            return None, 0
        from torch.utils.data import get_worker_info

        worker_id, num_workers = 0, 1
        info = get_worker_info()
        if info is not None:
            worker_id, num_workers = info.id, info.num_workers
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        share = self.disk_bytes // max(1, num_workers * local_world)
        return os.path.join(self.disk_dir, f"r{local_rank}-w{worker_id}"), share
