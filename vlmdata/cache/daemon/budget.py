"""How much SSD the readers need: what the cache daemon reports at start and as a metric.

Each reader (a DataLoader worker of a local rank) holds the shards of its current window while it
reads them, and the prefetcher brings in the next window. So the SSD tier needs about
`window_shards x workers x local_ranks x largest shard` bytes for every reader to find its shards
cached. A smaller budget costs refetches and reads that bypass the cache (never samples); the daemon
says what the configured windows need when it starts (from the manifests of the datasets it serves,
when it knows them) and again whenever readers' plans show more readers or larger shards.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from vlmdata.formats.manifest import Manifest
from vlmdata.retry import RetryPolicy

__all__ = ["ReaderWindows", "human_bytes", "largest_shard_bytes"]

log = logging.getLogger(__name__)


@dataclass
class ReaderWindows:
    """The readers' configuration the budget is sized for (`vlmdata cache-daemon --window-shards/--workers/
    --local-ranks`); the defaults are VLMDataset's and make_loader's."""

    window_shards: int = 8
    workers: int = 2
    local_ranks: int = 1

    def __post_init__(self) -> None:
        if min(self.window_shards, self.workers, self.local_ranks) < 1:
            raise ValueError("window shards, workers and local ranks must be >= 1")

    def need(self, largest_shard: int, live_readers: int = 0) -> int:
        """Bytes the readers' windows hold: window x readers x largest shard (readers: the configured
        workers x local ranks, or the readers connected now if more)."""
        readers = max(self.workers * self.local_ranks, live_readers)
        return self.window_shards * readers * int(largest_shard)

    def describe(self, largest_shard: int, live_readers: int = 0) -> str:
        readers = max(self.workers * self.local_ranks, live_readers)
        need = self.need(largest_shard, live_readers)
        return (f"{self.window_shards} shards per window x {readers} readers x {largest_shard} bytes "
                f"(largest shard) = {need} bytes ({human_bytes(need)})")


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{n} B"


def largest_shard_bytes(prefixes: list[str], storage_options: dict | None = None) -> int | None:
    """The largest shard of the vlmdata datasets at these prefixes (None when no manifest can be read)."""
    largest = None
    quick = RetryPolicy(attempts=2, base_delay=0.1, max_delay=0.5)
    for prefix in prefixes:
        try:
            manifest = Manifest.load(prefix, storage_options, quick)
        except Exception as exc:  # noqa: BLE001 - a prefix that is not one dataset's root: nothing to report
            log.debug("no manifest at %s (%s)", prefix, exc)
            continue
        sizes = [s.bytes for s in manifest.shards]
        if sizes:
            largest = max(largest or 0, max(sizes))
    return largest
