"""Raw inputs to shards: readers, validation, tokenization, the sharding engines (local processes; Ray), indexing foreign tars, `inspect`."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "ImageOptions": "images", "check_image": "images", "decode_resized": "images", "header_size": "images",
    "prepare_image": "images", "sniff": "images",
    "IndexConfig": "index_foreign", "index_dataset": "index_foreign",
    "inspect_dataset": "inspection",
    "write_dataset_tables": "finalize",
    "RenderedText": "show", "render_text": "show", "sample_report": "show", "show_samples": "show",
    "INPUT_FORMATS": "readers", "INPUT_FORMAT_ALIASES": "readers", "detect_format": "readers",
    "iter_json_array": "readers", "resolve_input": "readers",
    "ColumnSpec": "records",
    "ShardConfig": "shard", "shard_dataset": "shard",
})
