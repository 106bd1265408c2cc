"""Eviction: Belady vs LRU on known traces, merged plans, plan following with skips, LRU for unplanned gets."""
from __future__ import annotations

from tests.helpers.cache import FAST_RETRY
from tests.helpers.cache import equal_shards as _equal_shards
from vlmdata.cache import AccessPlan, CacheConfig, PlanBook, ShardCache, TieredFetcher, choose_victims
from vlmdata.testing import simulate, window_shuffle_trace


def _run_trace(tmp_path, trace, capacity_items, policy, size=1000):
    refs = _equal_shards(tmp_path / "src", max(trace) + 1, size)
    cfg = CacheConfig(memory_bytes=capacity_items * size, policy=policy, prefetch_bytes=0, retry=FAST_RETRY)
    fetcher = TieredFetcher(ShardCache(cfg))
    seq = [refs[i] for i in trace]
    fetcher.plan_ahead(seq)
    for r in seq:
        assert len(fetcher.get(r)) == size
    return fetcher.stats()["remote_fetches"]


def test_belady_beats_lru_on_known_trace(tmp_path):
    trace = [0, 1, 2, 3, 0, 1, 2, 3]  # cyclic: LRU misses every time
    assert _run_trace(tmp_path, trace, 3, "lru") == 8
    assert _run_trace(tmp_path, trace, 3, "belady") == 5  # the optimum for 3 slots


def test_window_shuffle_trace_matches_simulation_and_target(tmp_path):
    trace = window_shuffle_trace(60, window=4, epochs=3, seed=0, reads_per_shard=2)
    belady = _run_trace(tmp_path, trace, 30, "belady")
    lru = _run_trace(tmp_path, trace, 30, "lru")
    assert belady == simulate(trace, 30, "belady") and lru == simulate(trace, 30, "lru")
    assert belady == 60 + 2 * 30  # each later epoch refetches only what did not fit
    assert belady <= 0.8 * lru


def test_choose_victims_belady_and_lru_order():
    plans = PlanBook()
    plans.set("r", ["a", "b", "c", "a"])
    sizes = dict.fromkeys("abcx", 1)
    assert choose_victims(["a", "b", "c", "x"], sizes, 1, "lru", plans) == ["a"]
    assert choose_victims(["a", "b", "c", "x"], sizes, 1, "belady", plans) == ["x"]  # never used again
    assert choose_victims(["a", "b", "c"], sizes, 2, "belady", plans) == ["c", "b"]
    plans.set("s", ["c"])  # another reader needs c next: merged plans
    assert choose_victims(["a", "b", "c"], sizes, 1, "belady", plans) == ["b"]


def test_access_plan_tolerates_skips_and_unplanned_gets():
    p = AccessPlan(["a", "b", "c", "d", "a"], slack=2)
    assert p.consume("a") and p.pos == 1
    assert p.consume("c") and p.pos == 3  # "b" skipped (e.g. a failed shard)
    assert not p.consume("zzz") and p.pos == 3  # unplanned: position unchanged
    assert p.next_use("a") == 1 and p.next_use("b") == float("inf")
    q = AccessPlan(["a", "b", "a", "c"], slack=4)
    assert q.consume("a") and q.consume("b")
    assert not q.consume("b") and q.pos == 2  # a re-read of b: not a jump ahead
    assert q.consume("a") and q.pos == 3  # the planned next access
    r = AccessPlan(["a", "b", "c", "a"], slack=4)
    assert r.consume("a") and not r.consume("a") and r.pos == 1  # repeat of a, not its use at 3


def test_unplanned_gets_fall_back_to_lru(tmp_path):
    refs = _equal_shards(tmp_path / "src", 3)
    cfg = CacheConfig(memory_bytes=2000, policy="belady", prefetch_bytes=0, retry=FAST_RETRY)
    cache = ShardCache(cfg)
    for r in refs:  # no plan at all
        cache.get(r)
    assert len(cache.mem.entries) == 2 and refs[0].key not in cache.mem  # LRU evicted the oldest
    cache.get(refs[2])
    assert cache.stats.to_dict()["hits"] == {"remote": 3, "memory": 1}
