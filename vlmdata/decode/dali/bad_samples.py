"""Taking a pack's samples out of the loss after an in-process decode stage found their pixels bad.

The pack is already laid out (every shape the planner counted stays), so a sample whose image or clip
did not decode keeps its zeroed pixels but loses its loss (labels -100), is counted under the reason in
the pack's `stats`, and is listed in `bad_samples` (its key).
"""
from __future__ import annotations

__all__ = ["drop_samples"]


def drop_samples(batch: dict, samples: list[int], reason: str, count: int | None = None) -> None:
    """Drop the loss of pack samples `samples` (cu_seqlens segments, or bucket rows) and count them
    (`count`, default len(samples), under `reason` in `batch["stats"]["skipped"]`)."""
    n = len(samples) if count is None else count
    labels = batch.get("labels")
    if samples and labels is not None:
        if "cu_seqlens" in batch:
            cu = batch["cu_seqlens"].tolist()
            for k in samples:
                labels[cu[k]:cu[k + 1]] = -100
        elif labels.ndim == 2:
            labels[samples] = -100
    stats = batch.get("stats")
    if isinstance(stats, dict):
        skipped = stats.setdefault("skipped", {})
        skipped[reason] = skipped.get(reason, 0) + n
        if "samples" in stats:
            stats["samples"] = max(0, stats["samples"] - n)
    keys = batch.get("sample_keys")
    batch["bad_samples"] = list(batch.get("bad_samples", [])) + ([keys[k] for k in samples] if keys is not None
                                                                  else list(samples))
