"""Packing: budgets, exactly-once, and fill better than best-fit-decreasing."""
import numpy as np
import pytest

from vlmdata.plan import best_fit_decreasing, fill_ratio, next_fit, pack
from vlmdata.testing import gen_raw_lengths


def check_packs(order, bounds, lengths, images, max_tokens, max_images):
    assert sorted(order.tolist()) == list(range(len(lengths)))          # every sample exactly once
    assert bounds[0] == 0 and bounds[-1] == len(lengths) and (np.diff(bounds) > 0).all()
    tok = np.add.reduceat(lengths[order], bounds[:-1])
    img = np.add.reduceat(images[order], bounds[:-1])
    assert tok.max() <= max_tokens
    assert img.max() <= max_images


def test_pack_beats_bfd_on_gen_raw_lengths():
    lengths, images = gen_raw_lengths(6000, seed=1)
    lengths = np.minimum(lengths, 8192)
    order, bounds = pack(lengths, images, 8192, 16)
    check_packs(order, bounds, lengths, images, 8192, 16)
    ours = fill_ratio(lengths, bounds, 8192)
    _, b_bfd = best_fit_decreasing(lengths, images, 8192, 16)
    _, b_nf = next_fit(lengths, images, 8192, 16)
    assert ours >= 0.99
    assert ours > fill_ratio(lengths, b_bfd, 8192) > fill_ratio(lengths, b_nf, 8192)


def test_image_budget_binds():
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 200, 3000)
    images = rng.integers(0, 4, 3000)
    order, bounds = pack(lengths, images, 4096, 5)
    check_packs(order, bounds, lengths, images, 4096, 5)
    img = np.add.reduceat(images[order], bounds[:-1])
    assert (img == 5).mean() > 0.5          # the image budget, not tokens, closes most packs


def test_pack_edge_cases():
    order, bounds = pack(np.zeros(0, np.int64), np.zeros(0, np.int64), 100, 4)
    assert len(order) == 0 and bounds.tolist() == [0]
    order, bounds = pack(np.array([100, 100, 1]), np.array([0, 0, 0]), 100, 4)
    assert len(bounds) - 1 == 3
    check_packs(order, bounds, np.array([100, 100, 1]), np.array([0, 0, 0]), 100, 4)
    with pytest.raises(ValueError, match="within the budgets"):
        pack(np.array([101]), np.array([0]), 100, 4)


def test_pack_deterministic():
    lengths, images = gen_raw_lengths(2000, seed=3)
    lengths = np.minimum(lengths, 8192)
    a = pack(lengths, images, 8192, 16)
    b = pack(lengths.copy(), images.copy(), 8192, 16)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
