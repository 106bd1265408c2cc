"""Raw inputs to shards: readers, validation, tokenization, the sharding engines (local processes; Ray)."""
from vlmdata.ingest.readers import ConfigError
from vlmdata.ingest.records import ColumnSpec
from vlmdata.ingest.shard import EmptyDatasetError, ShardConfig, shard_dataset

__all__ = ["ColumnSpec", "ConfigError", "EmptyDatasetError", "ShardConfig", "shard_dataset"]
