"""The sample key index (keys.lmdb): building it in key order, reading it lock-free, finding samples by key,
and duplicate keys at shard time in bounded memory."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "KeyRanges": "buckets",
    "KeyIndexBuilder": "build", "iter_indices": "build", "open_dataset_keys": "build", "rebuild_keys": "build",
    "shard_signature": "build",
    "MAX_KEY_BYTES": "codec", "decode_location": "codec", "encode_key": "codec", "encode_keys": "codec",
    "encode_locations": "codec",
    "IN_RUN": "dedup", "RunDedup": "dedup", "SeenKeys": "dedup",
    "FoundSample": "lookup", "SampleLocation": "lookup", "find_samples": "lookup", "lookup_sample": "lookup",
    "read_sample_at": "lookup",
    "KeySorter": "sorter", "argsort_keys": "sorter",
    "KEYS_NAME": "store", "KeyIndex": "store", "write_key_index": "store",
})
