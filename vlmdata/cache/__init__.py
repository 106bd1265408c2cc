"""Shard fetching and caching: tiers, eviction policies, prefetcher, per-node daemon."""
from vlmdata.cache.config import CacheConfig
from vlmdata.cache.fetch import DirectFetcher, FetchError, RetryPolicy, ShardFetcher, ShardRef
from vlmdata.cache.keys import BadKeyError

__all__ = ["BadKeyError", "CacheConfig", "DirectFetcher", "FetchError", "RetryPolicy", "ShardFetcher", "ShardRef"]
