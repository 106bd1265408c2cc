"""Patch flattening: a round trip, and the merge-block order of the rows."""
import numpy as np
import pytest

from vlmdata.decode import flatten_patches, unflatten_patches


def test_patches_roundtrip_and_merge_order():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (56, 84, 3), dtype=np.uint8)
    rows = flatten_patches(img, 14, 2)
    assert rows.shape == (4 * 6, 3 * 14 * 14)
    assert np.array_equal(unflatten_patches(rows, (4, 6), 14, 2), img)
    # the first merge block = the 2x2 top-left patches, row-major; each row is channel-major
    for j, (py, px) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        patch = img[py * 14:(py + 1) * 14, px * 14:(px + 1) * 14].transpose(2, 0, 1).reshape(-1)
        assert np.array_equal(rows[j], patch)
    with pytest.raises(ValueError):
        flatten_patches(img[:50], 14, 2)
