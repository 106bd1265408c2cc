"""The epoch plan on synthetic planning columns (no I/O): coverage, budgets, purity, lazy windows, locality,
overlong and image-heavy samples, mixing, dynamic-resolution lengths."""
from collections import Counter

import pytest

from tests.helpers.plan import FIXED112, planner, synthetic_columns
from vlmdata.decode import DynamicPolicy, FixedPolicy
from vlmdata.plan import Corpus, EpochPlanner, PlanOptions


def all_packs(p):
    return [p.pack_samples(g)[0].tolist() for g in range(p.total())]


def test_epoch_covers_every_sample_once_and_respects_budgets():
    cols, sizes = synthetic_columns()
    p = planner(cols, sizes)
    packs = all_packs(p)
    flat = [i for pk in packs for i in pk]
    assert sorted(flat) == list(range(int(sizes.sum())))
    for g in range(p.total()):
        _, tok, img = p.pack_samples(g)
        assert tok.sum() <= 2048 and img.sum() <= 8


def test_plan_is_pure_and_changes_with_epoch_and_seed():
    cols, sizes = synthetic_columns()
    assert all_packs(planner(cols, sizes)) == all_packs(planner(cols, sizes))
    assert all_packs(planner(cols, sizes, epoch=1)) != all_packs(planner(cols, sizes))
    assert all_packs(planner(cols, sizes, seed=5)) != all_packs(planner(cols, sizes))


def test_lazy_windows_plan_only_what_is_needed():
    cols, sizes = synthetic_columns(n_shards=40)
    p = planner(cols, sizes)
    p.pack_samples(0)
    assert p.planned_windows <= 2 < p.num_windows


def test_window_locality_and_shuffle():
    cols, sizes = synthetic_columns()
    p = planner(cols, sizes)
    k, _ = p.locate(0)
    window_shards = set(p.window_shards(k))
    assert len(window_shards) == 4
    first_window = [i for g in range(p.starts[1]) for i in p.pack_samples(g)[0]]
    assert set(cols["shard"][first_window].tolist()) == window_shards
    # packs are not in length order
    tokens = [int(p.pack_samples(g)[1].sum()) for g in range(p.starts[1])]
    assert tokens != sorted(tokens) and tokens != sorted(tokens, reverse=True)


def test_overlong_truncate_or_drop_counted():
    cols, sizes = synthetic_columns(long_frac=0.05)
    n_long = int((cols["text_tokens"] == 20000).sum())
    assert n_long > 0
    p = planner(cols, sizes, overlong="drop", max_images=16)
    flat = [i for pk in all_packs(p) for i in pk]
    assert len(flat) == int(sizes.sum()) - n_long
    assert sum(p.drops_at(g)["overlong"] for g in range(p.total())) == n_long
    p = planner(cols, sizes, overlong="truncate", max_images=16)
    flat = [i for pk in all_packs(p) for i in pk]
    assert len(flat) == int(sizes.sum())
    assert sum(sum(p.drops_at(g).values()) for g in range(p.total())) == 0


def test_too_many_images_dropped_and_counted():
    cols, sizes = synthetic_columns(max_images=6)
    p = planner(cols, sizes, max_images=5)
    flat = [i for pk in all_packs(p) for i in pk]
    n_bad = int((cols["n_images"] > 5).sum())
    assert len(flat) == int(sizes.sum()) - n_bad > 0
    assert sum(p.drops_at(g)["too_many_images"] for g in range(p.total())) == n_bad


def test_mixing_follows_weights_deterministically():
    a, sa = synthetic_columns(n_shards=10, seed=1)
    b, sb = synthetic_columns(n_shards=20, seed=2)
    corpus = Corpus.build([a, b], [sa, sb], [3.0, 1.0])
    opts = PlanOptions(max_tokens=2048, max_images=8, window_shards=4)
    p = EpochPlanner(corpus, FixedPolicy(112, 14), opts, 0, 0)
    flat = [i for g in range(p.total()) for i in p.pack_samples(g)[0].tolist()]
    n_a = int(sa.sum())
    total = n_a + int(sb.sum())
    from_a = sum(1 for i in flat if i < n_a)
    assert abs(from_a - round(total * 0.75)) <= 1
    assert abs(len(flat) - from_a - round(total * 0.25)) <= 1
    # source a is repeated (its own passes), b sub-sampled without repeats
    counts = Counter(flat)
    assert max(counts[i] for i in range(n_a)) >= 2
    assert max(counts[i] for i in range(n_a, total)) == 1
    # mixed windows hold both sources
    w0 = p.plan_window(0).samples
    assert (w0 < n_a).any() and (w0 >= n_a).any()
    p2 = EpochPlanner(corpus, FixedPolicy(112, 14), opts, 0, 0)
    assert flat == [i for g in range(p2.total()) for i in p2.pack_samples(g)[0].tolist()]


def test_dynamic_policy_lengths():
    cols, sizes = synthetic_columns()
    pol = DynamicPolicy(patch=14, merge=2, min_pixels=56 * 56, max_pixels=224 * 224)
    p = planner(cols, sizes, policy=pol, max_tokens=4096)
    g = 0
    samples, tok, _ = p.pack_samples(g)
    for s, t in zip(samples.tolist(), tok.tolist()):
        st, n = int(cols["image_start"][s]), int(cols["n_images"][s])
        expect = int(cols["text_tokens"][s]) + int(pol.tokens(cols["width"][st:st + n], cols["height"][st:st + n]).sum())
        assert t == min(expect, 4096)


def test_mix_samples_sets_epoch_length():
    a, sa = synthetic_columns(n_shards=6, seed=1)
    b, sb = synthetic_columns(n_shards=6, seed=2)
    corpus = Corpus.build([a, b], [sa, sb], [1.0, 1.0])
    opts = PlanOptions(max_tokens=2048, max_images=8, window_shards=2, mix_samples=101)
    p = EpochPlanner(corpus, FIXED112, opts, 0, 0)
    flat = [i for g in range(p.total()) for i in p.pack_samples(g)[0].tolist()]
    n_a = int(sa.sum())
    assert len(flat) == 101 and len(set(flat)) == 101
    assert abs(sum(i < n_a for i in flat) - 50.5) <= 1
    with pytest.raises(ValueError, match="weights"):
        Corpus.build([a, b], [sa, sb], [0.0, 0.0])
