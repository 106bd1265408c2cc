"""Compute-balanced steps: exactly once at several world sizes, elastic resume, determinism, a bound on
slowest / mean rank cost that the plain assignment violates, the cost model, the metrics."""
import numpy as np
import pytest

from vlmdata.decode import DynamicPolicy
from vlmdata.metrics import MetricSet, StatsDelta
from vlmdata.plan import Balance, Corpus, CostModel, EpochPlanner, PlanOptions, balance_step, serpentine_order
from vlmdata.testing import image_and_word_counts, image_sizes

QWEN = DynamicPolicy(patch=14, merge=2, min_pixels=56 * 56, max_pixels=1280 * 28 * 28)
COMPUTE = Balance(cost=CostModel().for_policy(QWEN))


def skewed_columns(n_shards=24, per_shard=120, seed=0):
    """Planning columns drawn from the benchmark corpus's distributions (image counts, caption words, image
    sizes), as Qwen2-VL sees them: one to eight images of up to 1280 tokens beside short and long texts."""
    rng = np.random.default_rng(seed)
    n = n_shards * per_shard
    images, words = image_and_word_counts(rng, n)
    width, height = image_sizes(rng, int(images.sum()))
    cols = {"text_tokens": (30 + 2 * images + words).astype(np.int32), "n_images": images.astype(np.int16),
            "image_start": np.cumsum(images) - images, "width": width.astype(np.int32),
            "height": height.astype(np.int32)}
    return cols, np.full(n_shards, per_shard)


def make_planner(balance=COMPUTE, seed=3, **opt):
    cols, sizes = skewed_columns()
    opts = PlanOptions(**{"max_tokens": 4096, "max_images": 64, "window_shards": 6, "balance": balance, **opt})
    return EpochPlanner(Corpus.build([cols], [sizes]), QWEN, opts, seed, 0)


def planned(p):
    """Every sample the plan holds (those it dropped as unfit are counted, and account for the rest)."""
    out = sorted(i for g in range(p.total()) for i in p.pack_samples(g)[0].tolist())
    dropped = sum(sum(p.drops_at(g).values()) for g in range(p.total()))
    assert len(out) + dropped == p.corpus.num_samples and len(set(out)) == len(out)
    return out


def step_costs(p, world, balance):
    """Per full step: the ranks' costs, from rank_packs with `balance` (None: as planned)."""
    sched = schedule_balanced(p, world, 1, balance)
    costs = COMPUTE.cost
    out = []
    facts = {}
    for g in range(p.total()):
        s, t, _ = p.pack_samples(g)
        vt, vs = p.pack_vision(g)
        facts.update(zip(s.tolist(), costs.sample_costs(t, vt, vs).tolist()))
    for step in range(p.total() // world):
        out.append([sum(facts[i] for i in sched[r][step].samples.tolist()) for r in range(world)])
    return np.asarray(out)


def schedule_balanced(p, world, workers, balance, base=0):
    from vlmdata.plan import rank_packs
    out = {}
    for r in range(world):
        per_worker = [list(rank_packs(p, base, world, r, w, workers, balance)) for w in range(workers)]
        merged = []
        for i in range(max(len(x) for x in per_worker)):
            merged += [x[i] for x in per_worker if i < len(x)]
        out[r] = merged
    return out


@pytest.mark.parametrize("world,workers", [(1, 1), (2, 3), (4, 2), (8, 1), (13, 2)])
def test_balanced_steps_deliver_every_sample_once_within_budgets(world, workers):
    p = make_planner()
    sched = schedule_balanced(p, world, workers, COMPUTE)
    assert len({len(v) for v in sched.values()}) == 1                 # equal step counts
    seen = [i for v in sched.values() for a in v for i in a.samples.tolist()]
    assert sorted(seen) == planned(p)
    tokens = {}
    for g in range(p.total()):
        s, t, im = p.pack_samples(g)
        tokens.update(zip(s.tolist(), zip(t.tolist(), im.tolist())))
    for v in sched.values():
        for a in v:
            assert sum(tokens[i][0] for i in a.samples.tolist()) <= 4096
            assert sum(tokens[i][1] for i in a.samples.tolist()) <= 64
    # a step holds exactly the samples of its planned packs (the cursor means what it meant)
    n_full = p.total() // world
    for s in range(n_full):
        dealt = sorted(i for r in range(world) for i in sched[r][s].samples.tolist())
        assert dealt == sorted(i for g in range(s * world, (s + 1) * world) for i in p.pack_samples(g)[0].tolist())


@pytest.mark.parametrize("after_world", [2, 8])
def test_stop_at_step_k_with_four_ranks_and_resume_with_another_world_size(after_world):
    p = make_planner()
    before = schedule_balanced(p, 4, 2, COMPUTE)
    k = 5
    cursor = before[0][k].cursor
    assert all(before[r][k].cursor == cursor for r in range(4)) and cursor == 4 * (k + 1)
    consumed = [i for r in range(4) for a in before[r][:k + 1] for i in a.samples.tolist()]
    resumed = make_planner()                                           # a fresh process: same plan
    after = schedule_balanced(resumed, after_world, 3, COMPUTE, base=cursor)
    rest = [i for v in after.values() for a in v for i in a.samples.tolist()]
    assert sorted(consumed + rest) == planned(p)


def test_same_seed_same_assignment_other_seed_other_plan():
    a = schedule_balanced(make_planner(), 4, 2, COMPUTE)
    b = schedule_balanced(make_planner(), 4, 2, COMPUTE)
    assert {r: [x.samples.tolist() for x in v] for r, v in a.items()} == \
        {r: [x.samples.tolist() for x in v] for r, v in b.items()}
    c = schedule_balanced(make_planner(seed=4), 4, 2, COMPUTE)
    assert [x.samples.tolist() for x in c[0]] != [x.samples.tolist() for x in a[0]]


def test_global_order_does_not_depend_on_the_world_size():
    p = make_planner()
    for world in (2, 4, 8):
        sched = schedule_balanced(p, world, 1, COMPUTE)
        for s in range(p.total() // world):
            dealt = sorted(i for r in range(world) for i in sched[r][s].samples.tolist())
            assert dealt == sorted(i for g in range(s * world, (s + 1) * world) for i in p.pack_samples(g)[0])


def test_balance_bounds_slowest_over_mean_rank_where_the_plain_assignment_does_not():
    world = 8
    plain = step_costs(make_planner(Balance("none")), world, None)
    balanced = step_costs(make_planner(), world, COMPUTE)
    ratio = lambda c: c.max(axis=1) / c.mean(axis=1)                  # noqa: E731
    assert ratio(plain).mean() > 1.06                                  # the skew is real
    assert ratio(balanced).mean() < 1.03
    assert np.percentile(ratio(balanced), 95) < np.percentile(ratio(plain), 95)


def test_step_deal_moves_cost_not_budget():
    # two packs at the same tokens, one of images (costly), one of text: swaps even them out
    packs = [np.array([0, 1, 2, 3]), np.array([4, 5, 6, 7])]
    tokens = [np.array([1000, 1000, 1000, 1000]), np.array([1000, 1000, 1000, 1000])]
    images = [np.array([1, 1, 1, 1]), np.array([0, 0, 0, 0])]
    costs = [np.array([3.0, 3.0, 3.0, 3.0]), np.array([1.0, 1.0, 1.0, 1.0])]
    deal = balance_step(packs, tokens, images, costs, 4000, 4, Balance())
    assert deal.imbalance_before == pytest.approx(1.5)
    assert deal.imbalance == pytest.approx(1.0)
    assert sorted(np.concatenate(deal.samples).tolist()) == list(range(8))
    assert [len(s) for s in deal.samples] == [4, 4]
    none = balance_step(packs, tokens, images, costs, 4000, 4, Balance("none"))
    assert [s.tolist() for s in none.samples] == [p.tolist() for p in packs]


def test_serpentine_order_starts_and_ends_costly():
    costs = np.array([5.0, 1.0, 4.0, 2.0, 3.0, 6.0, 0.0, 7.0, 2.0])
    order = serpentine_order(costs, 3)
    assert sorted(order.tolist()) == list(range(9))
    # down, up, and the last block (which would end cheap going down) as a V
    assert costs[order].tolist() == [5.0, 4.0, 1.0, 2.0, 3.0, 6.0, 7.0, 0.0, 2.0]
    assert serpentine_order(costs, 0).tolist() == list(range(9))


def test_cost_model_from_a_qwen2_vl_config_and_errors():
    config = {"hidden_size": 3584, "num_hidden_layers": 28, "intermediate_size": 18944, "num_attention_heads": 28,
              "num_key_value_heads": 4, "vocab_size": 152064,
              "vision_config": {"embed_dim": 1280, "depth": 32, "mlp_ratio": 4, "spatial_merge_size": 2}}
    model = CostModel.from_config(config)
    assert model == CostModel()                                        # the default is this 7B + 600M ViT
    assert 6 * 7.0e9 < model.lm_token < 6 * 8.5e9                      # ~7.6B parameters with the LM head
    # a sample's attention grows with the square of its length: one 8k sample > sixteen 512s
    one = model.sample_costs([8192], [0], [0]).sum()
    sixteen = model.sample_costs([512] * 16, [0] * 16, [0] * 16).sum()
    assert one > 1.05 * sixteen
    with pytest.raises(ValueError, match="num_hidden_layers"):
        CostModel.from_config({"hidden_size": 8})
    with pytest.raises(ValueError, match="balance target"):
        Balance("fast")


def test_step_imbalance_and_flops_reach_the_metrics():
    p = make_planner()
    a = next(iter(schedule_balanced(p, 4, 1, COMPUTE)[1]))
    assert a.cost > 0 and a.imbalance >= 1.0 and a.imbalance_before >= a.imbalance
    delta = StatsDelta.from_dict({**StatsDelta().to_dict(), "compute_flops": a.cost, "step_imbalance": a.imbalance})
    metrics = MetricSet()
    metrics.absorb(delta, rank=1)
    reg = metrics.registry
    assert reg.get_sample_value("vlmdata_compute_flops_total", {"rank": "1"}) == pytest.approx(a.cost)
    assert reg.get_sample_value("vlmdata_step_imbalance_ratio_count", {"rank": "1"}) == 1


def test_balanced_plan_through_a_plan_share_equals_the_local_one(tmp_path):
    from vlmdata.plan import PlanShare
    local = schedule_balanced(make_planner(), 4, 1, COMPUTE)
    p = make_planner()
    store = PlanShare.at(str(tmp_path)).store("balanced", p.num_windows)
    shared = EpochPlanner(p.corpus, QWEN, p.options, p.seed, p.epoch, store=store)
    again = schedule_balanced(shared, 4, 1, COMPUTE)                   # vision columns read back from the files
    assert {r: [a.samples.tolist() for a in v] for r, v in again.items()} == \
        {r: [a.samples.tolist() for a in v] for r, v in local.items()}
    assert store.get(0, lambda: None).image_squares is not None


def test_a_steps_deal_is_computed_once_per_planner(monkeypatch):
    """Announcing a window's reads and building its packs ask for the same deals: they are dealt once."""
    from vlmdata.plan import assign

    p = make_planner()
    planned(p)
    calls = []
    real = assign.balance_step
    monkeypatch.setattr(assign, "balance_step", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = [assign.rank_step_samples(p, start, 4, 1, COMPUTE) for start in range(0, 40, 4)]
    again = [assign.rank_step_samples(p, start, 4, 1, COMPUTE) for start in range(0, 40, 4)]
    assert len(calls) == 10
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    fresh = make_planner()                  # another planner of the same epoch deals again, to the same result
    planned(fresh)
    assert all(np.array_equal(a, assign.rank_step_samples(fresh, start, 4, 1, COMPUTE))
               for a, start in zip(first, range(0, 40, 4)))
    assert len(calls) == 20
