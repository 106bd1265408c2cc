"""Dynamic resolution: what DALI decodes is exactly what the planner counted, for every image.

The planner's image tokens come from `policy.tokens(width, height)` on the index
columns (no decode); the DALI decoder resizes each image to
`policy.target_size` of the same indexed size, so its patch grid must give
exactly that many tokens. Checked for every image of a sharded gen_raw corpus,
and end to end through VLMDataset packs (decoder="dali").
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.decode import shard_corpus
from vlmdata.decode import DynamicPolicy
from vlmdata.decode.dali import DaliCpuDecoder
from vlmdata.formats import read_sample
from vlmdata.loading import open_source

POLICY = DynamicPolicy(patch=14, merge=2, min_pixels=56 * 56, max_pixels=448 * 448)


@pytest.fixture(scope="module")
def dataset(small_llava_corpus, tmp_path_factory):
    return shard_corpus(small_llava_corpus, tmp_path_factory.mktemp("ds") / "ds")


def test_every_image_decodes_to_the_planned_token_count(dataset):
    src = open_source(str(dataset))
    dec = DaliCpuDecoder(max_batch=16)
    seen = 0
    for s in range(src.num_shards):
        ix = src.index(s)
        planned = POLICY.tokens(ix.width, ix.height)
        data = (dataset / src.manifest.shards[s].name).read_bytes()
        images, sizes = [], []
        for i in range(len(ix)):
            rec = read_sample(data, ix, i)
            images += rec.images
            sizes += rec.sizes
        assert sizes == list(zip(ix.width.tolist(), ix.height.tolist()))
        out = dec.decode(images, sizes, POLICY)
        for k, (arr, (w, h)) in enumerate(zip(out, sizes)):
            assert arr is not None
            th, tw = arr.shape[:2]
            assert (tw, th) == POLICY.target_size(w, h)
            assert th % POLICY.factor == 0 and tw % POLICY.factor == 0
            assert POLICY.min_pixels <= th * tw <= POLICY.max_pixels
            assert (th // POLICY.patch) * (tw // POLICY.patch) // POLICY.merge ** 2 == planned[k]
        seen += len(out)
    assert seen == src.manifest.num_images > 100


def test_packs_hold_the_planned_image_tokens(dataset):
    from vlmdata.loading import VLMDataset

    ds = VLMDataset(str(dataset), seed=0, max_tokens=4096, max_images=16, image_size=POLICY,
                    rank=0, world_size=1, decoder="dali")
    image_id = ds.collate_config.image_token_id
    images = samples = 0
    for batch in ds:
        grid = batch["image_grid"].numpy()
        cu = batch["vision_cu_seqlens"].numpy()
        patches = grid[:, 1] * grid[:, 2]
        assert batch["pixel_values"].shape[0] == int(patches.sum()) == int(cu[-1])
        np.testing.assert_array_equal(np.diff(cu), patches)
        assert int((batch["input_ids"] == image_id).sum()) == int(patches.sum()) // POLICY.merge ** 2
        images += len(grid)
        samples += len(batch["sample_keys"])
        assert not batch["stats"]["skipped"]
    src = open_source(str(dataset))
    assert samples == src.num_samples and images == src.manifest.num_images
