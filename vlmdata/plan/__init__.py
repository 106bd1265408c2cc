"""Pure-numpy planning: shuffle, sample lengths, packing, bucketing, rank/worker assignment."""
from vlmdata.plan.packing import best_fit_decreasing, fill_ratio, next_fit, pack
from vlmdata.plan.plan import Corpus, EpochPlanner, PlanOptions, WindowPlan

__all__ = ["Corpus", "EpochPlanner", "PlanOptions", "WindowPlan", "best_fit_decreasing", "fill_ratio",
           "next_fit", "pack"]
