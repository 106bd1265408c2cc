"""Issue 20, item 6: the habits of a plain torch dataset. `DataLoader(ds)` with a batch size is a clear one-line
error (also from workers); `DataLoader(ds, batch_size=None)` works; `len(ds)` is exactly the packs this rank
yields in the epoch (ranks, workers, resume, epochs), cached; `estimated_len()`; the image budget per pack
follows the image policy (no image cap, a patch budget, for dynamic-resolution families)."""
from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import DataLoader

from tests.helpers.dataset import make_samples, write_dataset
from vlmdata.decode import DynamicPolicy, FixedPolicy
from vlmdata.errors import BatchingError, ConfigError, Skip
from vlmdata.loading import DatasetOptions, VLMDataset, make_loader
from vlmdata.loading import dataset as dataset_module
from vlmdata.plan import Corpus, EpochPlanner, PlanOptions, fill_ratio, sample_lengths

MAX_TOKENS = 512


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("dropin"))
    write_dataset(root, make_samples(90, seed=3, long_text=150), shard_size=10)
    return root


def dataset(root, rank=0, world=1, **kw):
    return VLMDataset(root, max_tokens=MAX_TOKENS, image_size=kw.pop("image_size", 56), rank=rank, world_size=world,
                      options=kw.pop("options", DatasetOptions(window_shards=2)), **kw)


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_with_a_batch_size_is_a_clear_error(root, workers):
    ds = dataset(root)
    with pytest.raises(BatchingError) as err:
        next(iter(DataLoader(ds, num_workers=workers)))
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    assert message.startswith("a VLMDataset yields whole packs (each already a batch), but the DataLoader batched 1 ")
    assert "DataLoader(ds, batch_size=None)" in message and "vlmdata.loading.make_loader(ds)" in message
    if workers:
        assert message.endswith("(raised in DataLoader worker process 0)")
    with pytest.raises(BatchingError, match="batched 4 of them"):
        next(iter(DataLoader(ds, batch_size=4)))


def test_dataloader_without_batching_yields_the_packs(root):
    ds = dataset(root)
    plain = [b["sample_keys"] for b in DataLoader(ds, batch_size=None)]
    assert plain == [b["sample_keys"] for b in ds] and len(plain) == len(ds)


@pytest.mark.parametrize("world", [1, 3])
def test_len_is_the_packs_each_rank_yields(root, world):
    for rank in range(world):
        ds = dataset(root, rank=rank, world=world)
        loader = make_loader(ds, num_workers=2)
        got = sum(1 for _ in loader)
        assert len(ds) == len(loader) == got == -(-ds.planner().total() // world) > 0


def test_len_is_the_epoch_total_whatever_the_resume_point_and_follows_the_epoch(root):
    ds = dataset(root)
    total = len(ds)
    batches = list(ds)
    assert len(batches) == total
    ds.load_state_dict(batches[total // 2 - 1]["state"])
    assert len(ds) == total and ds.num_steps() == total - total // 2
    assert len(make_loader(ds, num_workers=0)) == total
    ds.set_epoch(1)
    assert len(ds) == sum(1 for _ in ds) == ds.planner(1).total()


def test_len_is_planned_once_per_epoch_and_truthiness_plans_nothing(root, monkeypatch):
    calls = []
    total = dataset_module.EpochPlanner.total
    monkeypatch.setattr(dataset_module.EpochPlanner, "total", lambda self: calls.append(self.epoch) or total(self))
    ds = dataset(root)
    assert ds and calls == []
    n = len(ds)
    assert len(ds) == n and calls == [0]
    ds.set_epoch(2)
    len(ds), len(ds)
    assert calls == [0, 2]


def test_estimated_len(root):
    ds = dataset(root)
    exact = len(ds)
    windows = ds.planner().num_windows
    assert windows == 5
    assert ds.estimated_len(windows) == exact
    estimate = ds.estimated_len(2)
    assert abs(estimate - exact) <= 0.2 * exact
    cheap = dataset(root, options=DatasetOptions(window_shards=2, length="estimate"))
    assert len(cheap) == cheap.estimated_len() == ds.estimated_len()
    with pytest.raises(ValueError, match="length must be"):
        DatasetOptions(length="guess")


def test_image_budget_follows_the_image_policy(root):
    fixed = dataset(root).plan_options
    assert (fixed.max_images, fixed.max_patches) == (16, None)
    dynamic = dataset(root, image_size=DynamicPolicy(min_pixels=56 * 56, max_pixels=112 * 112)).plan_options
    assert (dynamic.max_images, dynamic.max_patches) == (None, MAX_TOKENS * 4)
    asked = dataset(root, image_size=DynamicPolicy(min_pixels=56 * 56, max_pixels=112 * 112), max_images=2)
    assert (asked.plan_options.max_images, asked.plan_options.max_patches) == (2, None)
    assert dataset(root, max_patches=300).plan_options.max_patches == 300
    with pytest.raises(ConfigError, match="not both"):
        dataset(root, max_images=4, max_patches=300)


def test_fixed_policy_defaults_keep_their_resume_fingerprint(root):
    assert dataset(root).fingerprint == dataset(root, max_images=16).fingerprint
    assert dataset(root, max_patches=MAX_TOKENS * 4).fingerprint != dataset(root).fingerprint


def _many_small_images(n=2000, seed=0):
    """Planning columns where an image count cap binds long before the token budget: 4-12 small images each."""
    rng = np.random.default_rng(seed)
    n_img = rng.integers(4, 13, n).astype(np.int32)
    total = int(n_img.sum())
    cols = {"text_tokens": rng.integers(20, 400, n).astype(np.int32), "n_images": n_img,
            "width": rng.integers(40, 300, total).astype(np.int32), "height": rng.integers(40, 300, total).astype(np.int32)}
    cols["image_start"] = (np.cumsum(n_img) - n_img).astype(np.int64)
    return Corpus.build([cols], [np.full(n // 200, 200)])


def _plan(corpus, policy, **budget):
    planner = EpochPlanner(corpus, policy, PlanOptions(max_tokens=4096, window_shards=10, **budget), seed=0, epoch=0)
    plan = planner.plan_window(0)
    return planner, plan


def test_patch_budget_packs_full_where_an_image_cap_does_not_and_holds_per_pack():
    corpus = _many_small_images()
    policy = DynamicPolicy(min_pixels=28 * 28, max_pixels=28 * 28 * 64)
    _, capped = _plan(corpus, policy, max_images=16)
    _, budget = _plan(corpus, policy, max_images=None, max_patches=4096 * 4)
    assert fill_ratio(capped.tokens, capped.bounds, 4096) < 0.9
    assert fill_ratio(budget.tokens, budget.bounds, 4096) > 0.99
    assert sorted(budget.samples.tolist()) == sorted(capped.samples.tolist()) == list(range(2000))
    _, tight = _plan(corpus, policy, max_images=None, max_patches=1000)
    cols, rows = corpus.gather(np.arange(2000))
    patches = sample_lengths(cols, rows, policy)[1] * 4             # each image token is 2 x 2 patches
    per_pack = np.add.reduceat(patches[tight.samples], tight.bounds[:-1])
    assert per_pack.max() <= 1000 and len(tight.bounds) > len(budget.bounds)
    over = int((patches > 1000).sum())
    assert tight.dropped[Skip.TOO_MANY_IMAGES] == over > 0 and len(tight.samples) + over == 2000


def test_patch_budget_drops_and_counts_samples_over_it():
    corpus = _many_small_images(n=400)
    policy = FixedPolicy(size=56)                   # 4 tokens = 16 patches an image
    _, plan = _plan(corpus, policy, max_images=None, max_patches=16 * 8)
    n_img = corpus.gather(np.arange(400))[0]["n_images"]
    assert plan.dropped[Skip.TOO_MANY_IMAGES] == int((n_img > 8).sum()) > 0
    assert len(plan.samples) + plan.dropped[Skip.TOO_MANY_IMAGES] == 400


def test_a_qwen2_vl_dataset_defaults_to_a_patch_budget(tmp_path):
    from tests.helpers.models import QWEN_TEST_PIXELS, qwen_folder_or_skip, shard_reference_rows

    folder = qwen_folder_or_skip(**QWEN_TEST_PIXELS)
    _, expected, data = shard_reference_rows(tmp_path, folder)
    ds = VLMDataset(str(data), max_tokens=1024, rank=0, world_size=1)
    assert ds.model_family.name == "qwen2_vl" and isinstance(ds.policy, DynamicPolicy)
    assert (ds.plan_options.max_images, ds.plan_options.max_patches) == (None, 1024 * 4)
    keys = [k for b in DataLoader(ds, batch_size=None) for k in b["sample_keys"]]
    assert sorted(keys) == sorted(f"conv{i}" for i in range(len(expected))) and len(ds) == ds.planner().total()
