"""Planned windows and where a planner keeps them.

A `WindowPlan` is the packs of one window. A planner asks its `WindowStore`
for window k with a function that plans it: `LocalWindows` keeps the last few
in the process (a planner of its own), `plan.shared.SharedWindows` keeps them
in files that every DataLoader worker of a rank (or every rank of a node)
maps, so that each window is planned once there. `count(k)` tells a planner
how many packs window k holds when any process sharing the store planned it,
which is all a planner needs to number the packs of later windows.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

__all__ = ["LocalWindows", "WindowPlan", "WindowStore"]


@dataclass
class WindowPlan:
    """The packs of one window: pack p holds samples[bounds[p]:bounds[p+1]]."""

    samples: np.ndarray
    bounds: np.ndarray
    tokens: np.ndarray       # planned tokens per entry of `samples` (overlong ones at max_tokens)
    images: np.ndarray       # images per entry of `samples`
    dropped: Counter = field(default_factory=Counter)
    image_tokens: np.ndarray | None = None    # image tokens per entry (None: not planned with them)
    image_squares: np.ndarray | None = None   # sum of each image's tokens squared, per entry

    @property
    def num_packs(self) -> int:
        return len(self.bounds) - 1

    def pack(self, p: int) -> np.ndarray:
        return self.samples[self.bounds[p]:self.bounds[p + 1]]


class WindowStore(Protocol):
    """Where a planner gets planned windows from."""

    def get(self, k: int, compute: Callable[[], WindowPlan]) -> WindowPlan:
        """Window k: kept, or planned now by `compute()` (and kept)."""

    def count(self, k: int) -> int | None:
        """Packs of window k if it was planned (here or by a process sharing the store), else None."""


class LocalWindows:
    """The last `keep` planned windows of one process, and the pack counts of every window it planned."""

    def __init__(self, keep: int = 4):
        self.keep = max(1, int(keep))
        self._plans: OrderedDict[int, WindowPlan] = OrderedDict()
        self._counts: dict[int, int] = {}
        self.computed = 0

    def get(self, k: int, compute: Callable[[], WindowPlan]) -> WindowPlan:
        plan = self._plans.get(k)
        if plan is not None:
            self._plans.move_to_end(k)
            return plan
        plan = compute()
        self.computed += 1
        self._counts[k] = plan.num_packs
        self._plans[k] = plan
        while len(self._plans) > self.keep:
            self._plans.popitem(last=False)
        return plan

    def count(self, k: int) -> int | None:
        return self._counts.get(k)
