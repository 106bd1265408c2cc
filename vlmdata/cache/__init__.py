"""Shard fetching and caching: tiers, Belady/LRU eviction, prefetcher, and (in `daemon`) the per-node cache daemon."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "CacheConfig": "config",
    "AccessPlan": "eviction", "PlanBook": "eviction", "choose_victims": "eviction",
    "DirectFetcher": "fetch", "RetryPolicy": "fetch", "ShardFetcher": "fetch", "ShardRef": "fetch",
    "entry_name": "keys", "key_for": "keys",
    "MappedShard": "local_shards", "map_local_shard": "local_shards",
    "VERIFIED": "verified", "VerifiedFiles": "verified", "file_identity": "verified",
    "ShardCache": "shard_cache", "TieredFetcher": "shard_cache",
    "DiskTier": "tiers",
})
