"""ShardCache: single-flight fetching, remote failures, the prefetcher following the plan."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.helpers.cache import FAST_RETRY, make_shards, wait_for
from tests.helpers.cache import as_bytes as _bytes
from tests.helpers.cache import equal_shards as _equal_shards
from tests.helpers.cache import tiered_cache as _cache
from vlmdata.cache import CacheConfig, DirectFetcher, ShardCache, ShardRef
from vlmdata.errors import FetchError


def test_single_flight_many_threads_one_fetch(tmp_path):
    refs = make_shards(tmp_path / "src", 1)
    calls = []
    release = threading.Event()

    class SlowFetcher(DirectFetcher):
        def get(self, ref):
            calls.append(ref.url)
            release.wait(30)
            return super().get(ref)

    cache = _cache(tmp_path, disk=0)
    cache.remote = SlowFetcher(retry=FAST_RETRY)
    n = 16
    results: list = [None] * n

    def reader(i: int) -> None:
        results[i] = _bytes(cache.get(refs[0]))

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    wait_for(lambda: cache.stats.joined == n - 1 and len(calls) == 1, what="all readers waiting on one fetch")
    release.set()
    for t in threads:
        t.join(30)
    assert len(calls) == 1
    assert all(r == results[0] for r in results) and results[0] == Path(refs[0].url).read_bytes()
    assert cache.stats.to_dict()["remote_fetches"] == 1


def test_remote_failures_surface_as_fetch_error(tmp_path):
    refs = make_shards(tmp_path / "src", 1)
    cache = _cache(tmp_path)
    with pytest.raises(FetchError):
        cache.get(ShardRef(url=str(tmp_path / "missing.tar"), key="missing"))
    wrong = ShardRef(url=refs[0].url, size=refs[0].size, crc32=(refs[0].crc32 + 1) & 0xFFFFFFFF, key="wrong")
    with pytest.raises(FetchError):
        cache.get(wrong)  # corrupt remote bytes: retried, then a FetchError, never served or cached
    assert "wrong" not in cache.disk and "wrong" not in cache.mem
    s = cache.stats.to_dict()
    assert s["fetch_errors"] == 2 and s["misses"]["remote"] == 2
    cache.close()


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
