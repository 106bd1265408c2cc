"""InternVL's tiling policy (decode.tiling.internvl) on its own: it travels as a dict and a pickle, its grids are
the processor's rule on hand-checked sizes (closest ratio; ties to more tiles while the image covers more than
half of them), its pixels are the grid row by row then the thumbnail, and bad settings are refused. Equality with
transformers' InternVLProcessor on 10^4 sizes and on real files is in tests/text/families/test_internvl.py."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from PIL import Image

from vlmdata.decode import TiledPolicy, make_policy

SPEC = {"kind": "internvl", "tile": 448, "patch": 14, "merge": 2, "image_token_id": 7, "per_tile": 256,
        "min_tiles": 1, "max_tiles": 12}


def test_round_trips_through_its_dict_and_pickle():
    policy = make_policy(SPEC)
    assert isinstance(policy, TiledPolicy) and policy.to_dict() == SPEC
    assert make_policy(policy.to_dict()) == policy and pickle.loads(pickle.dumps(policy)) == policy
    assert np.array_equal(pickle.loads(pickle.dumps(policy)).expansion(900, 450), policy.expansion(900, 450))


@pytest.mark.parametrize(("size", "grid", "tiles"), [
    ((448, 448), (1, 1), 1),        # square, one tile's area or less: one tile, no thumbnail
    ((800, 800), (2, 2), 5),        # 1:1 ties 1x1, 2x2, 3x3: the most tiles the image covers over half of
    ((3000, 3000), (3, 3), 10),
    ((896, 448), (2, 1), 3),        # 2:1 exactly, plus the thumbnail
    ((5000, 10), (12, 1), 13),      # extreme ratios: the widest grid allowed
    ((1, 1), (1, 1), 1),
])
def test_grids_follow_the_processors_rule(size, grid, tiles):
    policy = make_policy(SPEC)
    cols, rows = policy.tile_grid(*size)
    assert (int(cols), int(rows)) == grid and int(policy.tiles(*size)) == tiles
    assert int(policy.tokens(*size)) == 256 * tiles and len(policy.expansion(*size)) == 256 * tiles
    assert set(policy.expansion(*size).tolist()) == {7} and not policy.expansion(*size).flags.writeable


def test_tiling_off_gives_one_tile():
    policy = make_policy({**SPEC, "max_tiles": 1})
    assert policy.tiles(np.array([5000, 10, 448]), np.array([10, 5000, 448])).tolist() == [1, 1, 1]


def test_pixels_are_the_grid_row_by_row_then_the_thumbnail():
    policy = make_policy({**SPEC, "tile": 4})
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (5, 11, 3), np.uint8))        # 11x5: a 2x1 grid
    tiles = policy.pixels(image, 3)
    wide = np.asarray(image.resize((8, 4), 3))
    assert tiles.shape == (3, 4, 4, 3) and tiles.dtype == np.uint8
    assert np.array_equal(tiles[0], wide[:, :4]) and np.array_equal(tiles[1], wide[:, 4:])
    assert np.array_equal(tiles[2], np.asarray(image.resize((4, 4), 3)))


def test_bad_settings_are_refused():
    for bad in ({"tile": 0}, {"per_tile": 0}, {"min_tiles": 0}):
        with pytest.raises(ValueError, match="InternVL tiling needs"):
            make_policy({**SPEC, **bad})
