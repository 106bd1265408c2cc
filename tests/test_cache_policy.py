"""Belady vs LRU, plan following, and the prefetcher."""
from __future__ import annotations

import threading
import zlib
from pathlib import Path

from cache_fixtures import make_shards, wait_for

from vlmdata.cache import (
    AccessPlan,
    CacheConfig,
    DirectFetcher,
    PlanBook,
    RetryPolicy,
    ShardCache,
    TieredFetcher,
    choose_victims,
)
from vlmdata.testing import simulate, window_shuffle_trace

FAST_RETRY = RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.002)


def _equal_shards(root: Path, n: int, size: int = 1000):
    refs = make_shards(root, n, size=size)
    # make_shards grows each shard by its index; rewrite them to one size
    out = []
    for r in refs:
        data = Path(r.url).read_bytes()[:size]
        Path(r.url).write_bytes(data)
        out.append(type(r)(url=r.url, size=size, crc32=zlib.crc32(data) & 0xFFFFFFFF, key=r.key))
    return out


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


class CountingFetcher(DirectFetcher):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.urls: list[str] = []
        self.lock = threading.Lock()

    def get(self, ref):
        with self.lock:
            self.urls.append(ref.url)
        return super().get(ref)


def test_prefetch_fetches_ahead_within_budget(tmp_path):
    refs = _equal_shards(tmp_path / "src", 6)
    cfg = CacheConfig(memory_bytes=10_000, prefetch_bytes=3000, prefetch_threads=2, retry=FAST_RETRY)
    cache = ShardCache(cfg)
    cache.remote = CountingFetcher(retry=FAST_RETRY)
    cache.plan(0, refs)

    def settled() -> bool:
        with cache._lock:
            return not cache._queued and not cache._inflight

    wait_for(lambda: cache.stats.prefetch_fetches >= 3 and settled(), what="prefetch of the first window")
    assert cache.stats.prefetch_fetches == 3  # the budget holds three shards
    assert sorted(cache.remote.urls) == sorted(r.url for r in refs[:3])
    assert cache.stats.prefetch_lead == 3
    for r in refs[:3]:
        cache.get(r)
    assert cache.stats.to_dict()["hits"] == {"memory": 3}
    wait_for(lambda: cache.stats.prefetch_fetches == 6 and settled(), what="prefetch of the rest")
    for r in refs[3:]:
        cache.get(r)
    s = cache.stats.to_dict()
    assert s["hits"] == {"memory": 6} and s["remote_fetches"] == 6
    cache.close()


def test_prefetch_to_disk_tier_serves_from_disk(tmp_path):
    refs = _equal_shards(tmp_path / "src", 4)
    cfg = CacheConfig(memory_bytes=0, disk_dir=str(tmp_path / "ssd"), disk_bytes=10_000, prefetch_bytes=10_000,
                      retry=FAST_RETRY)
    cache = ShardCache(cfg, disk_dir=cfg.disk_dir)
    cache.plan(0, refs)
    wait_for(lambda: all(cache._resident(k) for k in cache.plans.plans[0].keys), what="prefetch to SSD")
    for r in refs:
        assert bytes(cache.get(r)) == Path(r.url).read_bytes()
    s = cache.stats.to_dict()
    assert s["hits"] == {"disk": 4} and s["prefetch_fetches"] == 4 and s["remote_fetches"] == 4
    cache.close()


def test_unplanned_gets_fall_back_to_lru(tmp_path):
    refs = _equal_shards(tmp_path / "src", 3)
    cfg = CacheConfig(memory_bytes=2000, policy="belady", prefetch_bytes=0, retry=FAST_RETRY)
    cache = ShardCache(cfg)
    for r in refs:  # no plan at all
        cache.get(r)
    assert len(cache.mem.entries) == 2 and refs[0].key not in cache.mem  # LRU evicted the oldest
    cache.get(refs[2])
    assert cache.stats.to_dict()["hits"] == {"remote": 3, "memory": 1}
