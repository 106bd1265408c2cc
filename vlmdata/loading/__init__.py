"""Loading for training: `VLMDataset` (plan, fetch, decode, collate) and `make_loader`."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "AdaptedDataset": "adapted",
    "CollateConfig": "collate", "IGNORE": "collate", "collate_bucket": "collate", "collate_pack": "collate",
    "PreparedSample": "collate", "prepare_sample": "collate",
    "build_dataloader": "dataloader",
    "DatasetOptions": "dataset", "VLMDataset": "dataset",
    "make_loader": "loader",
    "MemmapReader": "memmap_pack", "read_memmap_pack": "memmap_pack",
    "build_pack": "pack_build",
    "PackWriter": "shared_pack", "PackedBatch": "shared_pack", "set_shared_packs": "shared_pack",
    "shared_memory_available": "shared_pack",
    "open_source": "shard_source",
    "PendingVideo": "video_decode", "decode_videos": "video_decode", "defer_videos": "video_decode",
})
