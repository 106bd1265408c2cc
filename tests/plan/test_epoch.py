"""The epoch plan on synthetic planning columns (no I/O): coverage, budgets, purity, lazy windows, locality,
overlong and image-heavy samples, mixing, dynamic-resolution lengths; equality with the planner it replaced
(recorded digests and the reference copy), reads of one window's shards only, resume from a window anchor."""
from collections import Counter

import pytest

from tests.helpers.plan import FIXED112, planner, synthetic_columns
from tests.helpers.plan_cases import (
    CASES,
    RECORDED,
    SCHEDULES,
    case_columns,
    digest,
    plan_options,
    planner_facts,
    schedule_items,
)
from tests.helpers.reference_plan import ReferenceCorpus, ReferencePlanner, reference_rank_packs
from vlmdata.decode import DynamicPolicy, FixedPolicy
from vlmdata.plan import ArrayColumns, Corpus, EpochPlanner, LocalWindows, PlanOptions, rank_packs


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


# ---- the bounded-memory planner equals the planner it replaced ---------------------------------------
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_same_packs_order_drops_and_cursors_as_the_reference(case):
    cols, sizes = case_columns(case)
    opts = plan_options(case, PlanOptions)
    corpus, ref = Corpus.build(cols, sizes, case.weights), ReferenceCorpus.build(cols, sizes, case.weights)
    facts = planner_facts(EpochPlanner(corpus, case.policy, opts, 11, 2))
    assert facts == planner_facts(ReferencePlanner(ref, case.policy, opts, 11, 2))
    sched = [schedule_items(lambda: EpochPlanner(corpus, case.policy, opts, 11, 2), rank_packs, w, nw)
             for w, nw in SCHEDULES]
    # the digest recorded from the planner on main before it was replaced: packs, order, steps, cursors, drops
    assert digest([facts, sched]) == RECORDED[case.name]


class CountingColumns:
    """ShardColumns over a dict that records which shards each read asks for."""

    def __init__(self, cols, sizes):
        self.inner = ArrayColumns(cols, sizes)
        self.reads: list[list[int]] = []

    def read_shards(self, shards):
        self.reads.append(sorted(int(s) for s in shards))
        return self.inner.read_shards(shards)


def test_a_window_reads_only_its_own_shards():
    cols, sizes = synthetic_columns(n_shards=40)
    src = CountingColumns(cols, sizes)
    p = EpochPlanner(Corpus.build([src], [sizes]), FIXED112, PlanOptions(max_tokens=2048, max_images=8, window_shards=4), 0, 0)
    p.plan_window(3)
    assert src.reads == [sorted(p.window_shards(3))]


@pytest.mark.parametrize("case", [c for c in CASES if c.name in ("pack", "packless-windows", "mix-samples")],
                         ids=lambda c: c.name)
def test_resume_from_a_window_anchor_plans_one_or_two_windows_and_equals_the_reference(case):
    cols, sizes = case_columns(case)
    opts = plan_options(case, PlanOptions)
    corpus, ref_corpus = Corpus.build(cols, sizes, case.weights), ReferenceCorpus.build(cols, sizes, case.weights)
    full = EpochPlanner(corpus, case.policy, opts, 11, 2)
    total = full.total()
    starts = full.starts[:-1]
    for cursor in sorted({starts[1], starts[len(starts) // 2], starts[-1], total // 3, total // 2 + 1, total - 2}):
        anchor = full.anchor_for(cursor)
        assert anchor[1] <= cursor
        for world, workers in ((3, 2),):
            store = LocalWindows()
            resumed = [list(rank_packs(EpochPlanner(corpus, case.policy, opts, 11, 2, store=store, anchor=anchor),
                                       cursor, world, r, w, workers)) for r in range(world) for w in range(workers)]
            ref = ReferencePlanner(ref_corpus, case.policy, opts, 11, 2)
            expected = [list(reference_rank_packs(ref, cursor, world, r, w, workers))
                        for r in range(world) for w in range(workers)]
            as_data = lambda items: [[a.samples.tolist(), a.step, a.cursor, a.window, sorted(a.dropped.items())]  # noqa: E731
                                     for a in items]
            assert [as_data(x) for x in resumed] == [as_data(x) for x in expected]
        # only the windows from the anchor on were planned to get the first pack
        first = EpochPlanner(corpus, case.policy, opts, 11, 2, store=LocalWindows(), anchor=anchor)
        if cursor < total:
            first.pack_samples(cursor)
            assert first.store.computed <= 3 + sum(1 for c in full.counts if c == 0)
            assert first.planned_windows <= first.num_windows - anchor[0]


def test_pack_before_the_anchor_is_planned_backward_and_a_wrong_anchor_is_refused():
    cols, sizes = synthetic_columns()
    full = planner(cols, sizes)
    full.total()
    k = 4
    late = EpochPlanner(full.corpus, FIXED112, full.options, 0, 0, anchor=(k, full.starts[k]))
    assert late.locate(3) == full.locate(3) and late.pack_samples(3)[0].tolist() == full.pack_samples(3)[0].tolist()
    assert late.window_range(0) == (0, full.starts[1])
    wrong = EpochPlanner(full.corpus, FIXED112, full.options, 0, 0, anchor=(k, full.starts[k] + 5))
    with pytest.raises(ValueError, match="anchor"):
        wrong.locate(0)
    with pytest.raises(ValueError, match="anchor"):
        EpochPlanner(full.corpus, FIXED112, full.options, 0, 0, anchor=(full.num_windows + 1, 0))
