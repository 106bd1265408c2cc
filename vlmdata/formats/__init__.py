"""On-disk formats: WebDataset tar shards (+ DALI .idx), memmap shards, the sample index, the manifest."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "Member": "dali_idx", "format_index": "dali_idx", "parse_index": "dali_idx", "split_name": "dali_idx",
    "MemberCheck": "index_checks", "check_index_file": "index_checks", "memmap_bad_rows": "index_checks",
    "owner_tag": "index_checks",
    "Manifest": "manifest", "PLANNING_NAME": "manifest", "ShardInfo": "manifest",
    "MAGIC": "memmap", "MemmapPartWriter": "memmap", "MemmapShard": "memmap", "TRAILER": "memmap",
    "PLANNING_COLUMNS": "planning", "PlanningColumns": "planning", "PlanningWriter": "planning",
    "EncodedImage": "sample", "EncodedVideo": "sample", "StoredVideo": "sample", "read_sample": "sample", "safe_key": "sample", "text_decoder_for": "sample",
    "tokens_from_npy": "sample", "tokens_to_npy": "sample", "write_sample": "sample",
    "IndexBuilder": "sample_index", "SampleIndex": "sample_index", "concat_planning_columns": "sample_index",
    "CrcFile": "shard_writer", "WdsPartWriter": "shard_writer",
    "VideoColumns": "video_index",
    "CountingReader": "tar_scan", "is_utf8_name": "tar_scan", "scan_tar": "tar_scan",
    "TarShardWriter": "tar_writer", "member_bytes": "tar_writer",
    "VIEWS_DIR": "text_view", "ViewTokens": "text_view", "check_view_name": "text_view",
    "read_view_sample": "text_view", "view_planning_name": "text_view", "view_shard_name": "text_view",
})
