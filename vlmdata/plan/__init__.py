"""Pure-numpy planning: shuffle, sample lengths, packing, bucketing, rank/worker assignment, shared windows."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "rank_packs": "assign", "split_tail": "assign",
    "bucket": "bucketing", "padded_ratio": "bucketing",
    "ArrayColumns": "epoch", "Corpus": "epoch", "EpochPlanner": "epoch", "PlanOptions": "epoch",
    "ShardColumns": "epoch",
    "sample_lengths": "lengths",
    "best_fit_decreasing": "packing", "fill_ratio": "packing", "next_fit": "packing", "pack": "packing",
    "PlanShare": "shared", "SharedWindows": "shared",
    "LocalWindows": "window_store", "WindowPlan": "window_store", "WindowStore": "window_store",
})
