"""Raw inputs to shards: readers (tables, image folders, Hugging Face datasets; data: URLs), validation, tokenization,
the sharding engines (local processes; Ray), indexing foreign tars, text views (`retokenize`), `inspect`, sample
lengths against budgets (`lengths`), what a run skipped (`skips`)."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "AccessPolicy": "access", "DEFAULT_MAX_IMAGE_BYTES": "access", "read_ref": "access", "resolve_ref": "access",
    "iter_csv_rows": "csv_rows",
    "ImageOptions": "images", "check_image": "images", "decode_resized": "images", "header_size": "images",
    "VERIFY_MODES": "images", "prepare_image": "images", "sniff": "images", "verify_decodes": "images",
    "IndexConfig": "index_foreign", "index_dataset": "index_foreign",
    "inspect_dataset": "inspection",
    "BUDGETS": "lengths", "LengthReport": "lengths", "dataset_policy": "lengths", "length_report": "lengths",
    "DEFAULT_MAX_SKIP_FRACTION": "skips", "SkipSummary": "skips", "check_skips": "skips",
    "write_dataset_tables": "finalize",
    "RenderedText": "show", "ViewText": "show", "render_text": "show", "sample_report": "show",
    "show_samples": "show",
    "Piece": "rendering", "TokenRenderer": "rendering", "format_pieces": "rendering",
    "INPUT_FORMATS": "readers", "INPUT_FORMAT_ALIASES": "readers", "detect_format": "readers",
    "iter_json_array": "json_array", "resolve_input": "readers", "Row": "readers", "open_inputs": "readers",
    "RangedDataset": "hf_datasets", "dataset_inputs": "hf_datasets", "fill_rows": "hf_datasets",
    "decode_data_url": "data_url",
    "ColumnSpec": "records", "check_text": "records", "normalize": "records",
    "FrameList": "video", "VideoOptions": "video", "prepare_video": "video",
    "DEFAULT_FRAME_LIST_FPS": "frame_list", "prepare_frame_list": "frame_list",
    "CANONICAL_COLUMNS": "layouts", "detect_layout": "layouts", "parse_columns": "layouts",
    "RangeReader": "retokenize", "RetokenizeConfig": "retokenize", "RetokenizeResult": "retokenize",
    "retokenize_dataset": "retokenize",
    "ShardConfig": "shard", "shard_dataset": "shard",
})
