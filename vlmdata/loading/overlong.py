"""One log line per epoch and per worker: how many samples the loader truncated or dropped, and why.

The over-length policy itself is the plan's (`plan.epoch`: a sample longer than `max_tokens` is
planned at `max_tokens` and cut at its text tail by collate, or dropped as `overlong` when its
image tokens alone reach `max_tokens` or with `overlong="drop"`; more than the pack's image budget (`max_images` images or `max_patches` vision patches)
drop it as `too_many_images`). The counts travel in each pack's `stats` (`truncated`,
`skipped[overlong|too_many_images]`, hence the `vlmdata_truncated_samples_total` and
`vlmdata_skipped_samples_total{reason=...}` metrics); `LengthTally` adds up what one worker
delivered in one epoch and says it once, when the worker's epoch ends (or its iterator is closed).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping

from vlmdata.errors import Skip

__all__ = ["LengthTally"]

log = logging.getLogger(__name__)
DROP_REASONS = (Skip.OVERLONG, Skip.TOO_MANY_IMAGES)


class LengthTally:
    """The truncated and dropped samples of one worker's epoch, from its packs' `stats`."""

    def __init__(self, max_tokens: int, image_budget: str, overlong: str):
        self.max_tokens = max_tokens
        self.image_budget = image_budget      # e.g. "max_images=16" or "max_patches=32768"
        self.overlong = overlong
        self.samples = 0          # delivered, truncated ones included
        self.truncated = 0
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        self.other_skips = 0

    def add(self, stats: Mapping) -> None:
        """Count one pack's `stats` (a StatsDelta as a dict)."""
        self.samples += int(stats.get("samples", 0))
        self.truncated += int(stats.get("truncated", 0))
        for reason, n in (stats.get("skipped") or {}).items():
            if reason in self.dropped:
                self.dropped[reason] += int(n)
            else:
                self.other_skips += int(n)

    def message(self, where: str) -> str | None:
        """The line for this epoch (None when nothing was truncated or dropped)."""
        if not self.truncated and not any(self.dropped.values()):
            return None
        seen = self.samples + sum(self.dropped.values()) + self.other_skips
        parts = [f"{self.truncated} truncated to max_tokens={self.max_tokens} (cut at the text tail)"]
        over = self.dropped[Skip.OVERLONG]
        if over:
            why = "overlong='drop'" if self.overlong == "drop" else "their image tokens alone reach max_tokens"
            parts.append(f"{over} dropped as {Skip.OVERLONG} ({why})")
        many = self.dropped[Skip.TOO_MANY_IMAGES]
        if many:
            parts.append(f"{many} dropped as {Skip.TOO_MANY_IMAGES} (over the pack's image budget, {self.image_budget})")
        return (f"{where}: of {seen} samples, {', '.join(parts)}; counted in batch['stats'] and the "
                f"vlmdata_truncated_samples_total / vlmdata_skipped_samples_total metrics")

    def log(self, where: str) -> None:
        msg = self.message(where)
        if msg is not None:
            log.warning("%s", msg)
