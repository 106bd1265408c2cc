"""Random image sizes for the planners' token-count checks: log-uniform, so tiny, huge and extreme aspect
ratios all appear."""
from __future__ import annotations

import numpy as np


def log_uniform_sizes(n: int, seed: int, top: int, low: int = 1,
                      max_ratio: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`n` (widths, heights) of `low` to `top` px, log-uniform; with `max_ratio`, only sizes whose long side
    is less than `max_ratio` times the short one (what a processor refuses beyond)."""
    rng = np.random.default_rng(seed)
    draw = n if max_ratio is None else 4 * n
    w = np.exp(rng.uniform(np.log(low), np.log(top), draw)).astype(np.int64)
    h = np.exp(rng.uniform(np.log(low), np.log(top), draw)).astype(np.int64)
    if max_ratio is not None:
        keep = np.maximum(w, h) / np.minimum(w, h) < max_ratio
        w, h = w[keep], h[keep]
    if len(w) < n:
        raise AssertionError(f"only {len(w)} of {n} sizes within the ratio {max_ratio}")
    return w[:n], h[:n]
