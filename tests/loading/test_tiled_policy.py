"""Tiled image policies (decode.tiled): a policy registered by kind travels through its dict, its
structured token runs replace each image placeholder in both pack paths (and never carry loss), its
tiles fill pixel_values in order, and the decoders cut tiles from the decoded image."""
from __future__ import annotations

import io
import pickle
from dataclasses import dataclass

import numpy as np
import pytest
from PIL import Image

from tests.loading.test_pack_build import TOK, cfg, records, same, slow
from vlmdata.decode import ExactDecoder, TiledPolicy, make_policy, register_kind
from vlmdata.loading import IGNORE, pack_build, prepare_sample
from vlmdata.metrics import StatsDelta

START, END = 1001, 1002            # ids of the run's framing tokens (outside the byte tokenizer's specials)


@register_kind
@dataclass(frozen=True)
class StripTiles(TiledPolicy):
    """Test policy: one tile per started `tile` px of width, framed by START ... END, `per_tile` image
    tokens per tile and a row marker (START + 10 + i) before each tile."""

    kind = "test_strips"
    per_tile: int = 3

    def tiles(self, width, height):
        return -(-np.asarray(width, np.int64) // self.tile)

    def tokens(self, width, height):
        return 2 + self.tiles(width, height) * (1 + self.per_tile)

    def layout_key(self, width, height):
        return int(self.tiles(width, height))

    def build_expansion(self, n):
        run = [START]
        for i in range(n):
            run += [START + 10 + i] + [self.image_token_id] * self.per_tile
        return run + [END]

    def pixels(self, image, resample):
        n = int(self.tiles(image.width, image.height))
        wide = np.asarray(image.resize((n * self.tile, self.tile), resample))
        return np.stack([wide[:, i * self.tile:(i + 1) * self.tile] for i in range(n)])


POLICY = StripTiles(tile=28, patch=14, image_token_id=TOK.special.image)


def tiles_for(recs):
    return [[np.full((int(POLICY.tiles(w, h)), 28, 28, 3), 5, np.uint8) for w, h in r.sizes] for r in recs]


def test_a_registered_kind_round_trips_through_its_dict_and_pickle():
    again = make_policy(POLICY.to_dict())
    assert again == POLICY and isinstance(again, StripTiles)
    assert pickle.loads(pickle.dumps(again)) == POLICY
    assert np.array_equal(again.expansion(60, 20), POLICY.expansion(60, 20))
    with pytest.raises(ValueError, match="cannot make an image policy"):
        make_policy({"kind": "no_such_kind", "tile": 3})


def test_runs_replace_placeholders_in_both_pack_paths_and_carry_no_loss():
    recs, _ = records(seed=4)
    ims = tiles_for(recs)
    c = cfg(POLICY)
    fast = pack_build.build_pack(recs, ims, c, StatsDelta())
    assert pack_build._fast_pack(recs, ims, c, StatsDelta()) is not None
    same(fast, slow(recs, ims, c))
    ids, labels = fast["input_ids"].numpy(), fast["labels"].numpy()
    sizes = [sz for r in recs for sz in r.sizes]
    assert (ids == START).sum() == len(sizes) and (ids == END).sum() == len(sizes)
    assert int((ids == TOK.special.image).sum()) == sum(3 * int(POLICY.tiles(w, h)) for w, h in sizes)
    framed = np.isin(ids, [START, END]) | (ids == TOK.special.image) | ((ids > START + 9) & (ids < START + 40))
    assert (labels[framed] == IGNORE).all()
    for s, (w, h) in zip(np.flatnonzero(ids == START), sizes):    # each run is the policy's, in image order
        run = POLICY.expansion(w, h)
        assert np.array_equal(ids[s:s + len(run)], run)
    assert fast["image_tiles"].tolist() == [int(POLICY.tiles(w, h)) for w, h in sizes]
    assert fast["image_sizes"].tolist() == [list(sz) for sz in sizes]
    assert fast["pixel_values"].shape == (sum(fast["image_tiles"].tolist()), 3, 28, 28)
    assert int(fast["cu_seqlens"][-1]) == len(ids)


def test_the_planned_length_is_the_built_length():
    recs, _ = records(seed=5)
    ims = tiles_for(recs)
    for r, x in zip(recs, ims):
        sample, _ = prepare_sample(r.key, r.tokens, x, r.sizes, cfg(POLICY))
        text = r.tokens.shape[1] - len(r.sizes)
        assert len(sample.ids) == text + sum(int(POLICY.tokens(w, h)) for w, h in r.sizes)


def test_exact_decoder_cuts_tiles_from_the_full_image():
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (20, 70, 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(src).save(buf, "PNG")
    out = ExactDecoder(resample=3).decode([buf.getvalue()], [(70, 20)], POLICY)[0]
    want = POLICY.pixels(Image.fromarray(src), 3)
    assert out.shape == (3, 28, 28, 3) and np.array_equal(out, want)
    dec = ExactDecoder(resample=3)
    assert dec.decode([b"not an image"], [(70, 20)], POLICY) == [None]
    assert sum(dec.pop_errors().values()) == 1


def test_grid_tiles_are_row_major_crops():
    from vlmdata.decode.tiling import grid_tiles

    img = np.arange(6 * 9 * 3, dtype=np.int64).reshape(6, 9, 3)
    tiles = grid_tiles(img, 2, 3)
    assert tiles.shape == (6, 3, 3, 3)
    for r in range(2):
        for c in range(3):
            assert np.array_equal(tiles[r * 3 + c], img[r * 3:(r + 1) * 3, c * 3:(c + 1) * 3])
    with pytest.raises(ValueError, match="does not split"):
        grid_tiles(img, 4, 3)
