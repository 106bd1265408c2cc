"""vlmdata: a high-throughput multimodal data pipeline for training vision-language models.

What users touch is exported here; every name is imported lazily (PEP 562), so
`import vlmdata` imports neither torch nor prometheus_client. Subpackages
(`vlmdata.formats`, `vlmdata.cache`, `vlmdata.tune`, ...) declare their own
`__all__` for finer-grained use; errors and skip reasons are in `vlmdata.errors`.
"""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    # loading for training
    "VLMDataset": "loading.dataset", "DatasetOptions": "loading.dataset", "make_loader": "loading.loader",
    "Balance": "plan.balance", "CostModel": "plan.cost",
    "CacheConfig": "cache.config",
    "FixedPolicy": "decode.policy", "DynamicPolicy": "decode.policy", "ImagePolicy": "decode.policy",
    # sharding and the dataset's description
    "ShardConfig": "ingest.shard", "shard_dataset": "ingest.shard", "Manifest": "formats.manifest",
    # random access by sample key (keys.lmdb)
    "lookup_sample": "keyindex.lookup", "find_samples": "keyindex.lookup",
    # metrics
    "MetricSet": "metrics.registry", "instrument": "metrics.loader_metrics", "serve_metrics": "metrics.server",
    # errors
    "VlmdataError": "errors",
})
