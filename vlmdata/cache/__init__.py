"""Shard fetching and caching: tiers, eviction policies, prefetcher, per-node daemon."""
from vlmdata.cache.fetch import DirectFetcher, FetchError, ShardFetcher, ShardRef

__all__ = ["DirectFetcher", "FetchError", "ShardFetcher", "ShardRef"]
