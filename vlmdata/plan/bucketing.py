"""Length bucketing: batches of similar-length samples, for users who pad instead of pack."""
from __future__ import annotations

import numpy as np


def bucket(lengths: np.ndarray, images: np.ndarray, max_tokens: int, max_images: int) -> tuple[np.ndarray, np.ndarray]:
    """Group samples into batches of similar length whose padded size fits the budgets.

    Samples are sorted by length and cut greedily into batches with
    batch_size * longest <= max_tokens and total images <= max_images.
    Returns (order, bounds) like `packing.pack`.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    images = np.asarray(images, dtype=np.int64)
    order = np.argsort(lengths, kind="stable")
    bounds = [0]
    count = longest = img = 0
    for n, k in zip(lengths[order].tolist(), images[order].tolist()):
        if count and ((count + 1) * max(longest, n) > max_tokens or img + k > max_images):
            bounds.append(bounds[-1] + count)
            count = longest = img = 0
        count += 1
        longest = max(longest, n)
        img += k
    if count:
        bounds.append(bounds[-1] + count)
    return order.astype(np.int64), np.asarray(bounds, dtype=np.int64)


def padded_ratio(lengths: np.ndarray, order: np.ndarray, bounds: np.ndarray) -> float:
    """Real tokens / padded tokens of the batches."""
    lens = np.asarray(lengths)[order]
    if not len(lens):
        return 1.0
    longest = np.maximum.reduceat(lens, bounds[:-1])
    return float(lens.sum()) / float((longest * np.diff(bounds)).sum())
