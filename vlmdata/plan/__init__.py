"""Pure-numpy planning: shuffle, sample lengths, packing, bucketing, rank/worker assignment, compute balance
(cost model, balanced steps), shared windows."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "Assigned": "assign", "rank_packs": "assign", "rank_step_samples": "assign", "split_tail": "assign",
    "step_deal": "assign",
    "Balance": "balance", "StepDeal": "balance", "balance_step": "balance", "serpentine_order": "balance",
    "CostModel": "cost", "lm_coefficients": "cost", "vit_coefficients": "cost",
    "bucket": "bucketing", "padded_ratio": "bucketing",
    "ArrayColumns": "epoch", "Corpus": "epoch", "EpochPlanner": "epoch", "PlanOptions": "epoch",
    "ShardColumns": "epoch",
    "sample_lengths": "lengths",
    "best_fit_decreasing": "packing", "fill_ratio": "packing", "next_fit": "packing", "pack": "packing",
    "PlanShare": "shared", "SharedWindows": "shared",
    "LocalWindows": "window_store", "WindowPlan": "window_store", "WindowStore": "window_store",
})
