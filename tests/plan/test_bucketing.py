"""Bucketing: budgets hold, and batches of similar lengths pad far less than random ones."""
import numpy as np

from vlmdata.plan import bucket, padded_ratio
from vlmdata.testing import gen_raw_lengths


def test_bucketing_budgets_and_similar_lengths():
    lengths, images = gen_raw_lengths(3000, seed=2)
    lengths = np.minimum(lengths, 8192)
    order, bounds = bucket(lengths, images, 16384, 32)
    assert sorted(order.tolist()) == list(range(len(lengths)))
    lens = lengths[order]
    longest = np.maximum.reduceat(lens, bounds[:-1])
    assert (longest * np.diff(bounds)).max() <= 16384
    assert np.add.reduceat(images[order], bounds[:-1]).max() <= 32
    # similar lengths: far less padding than random batches of the same sizes
    rng = np.random.default_rng(0)
    shuffled = rng.permutation(len(lengths))
    assert padded_ratio(lengths, order, bounds) > padded_ratio(lengths, shuffled, bounds) + 0.2
