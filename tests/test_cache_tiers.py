"""Tiers: hits per tier, verification, crash safety of the SSD tier, single-flight, bad keys."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest
from cache_fixtures import REPO, make_shards, wait_for

from vlmdata.cache import CacheConfig, DirectFetcher, RetryPolicy, ShardCache, ShardRef
from vlmdata.errors import BadKeyError, FetchError

FAST_RETRY = RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.002)


def _bytes(v) -> bytes:
    return bytes(v[:]) if not isinstance(v, bytes) else v


def _cache(tmp_path: Path, memory: int = 1 << 20, disk: int = 1 << 20, **kw) -> ShardCache:
    cfg = CacheConfig(memory_bytes=memory, disk_dir=str(tmp_path / "ssd") if disk else None, disk_bytes=disk,
                      prefetch_bytes=kw.pop("prefetch_bytes", 0), retry=FAST_RETRY, **kw)
    return ShardCache(cfg, disk_dir=cfg.disk_dir)


def test_hits_are_counted_per_tier(tmp_path):
    refs = make_shards(tmp_path / "src", 3)
    cache = _cache(tmp_path)
    data = _bytes(cache.get(refs[0]))
    assert data == Path(refs[0].url).read_bytes()
    s = cache.stats.to_dict()
    assert s["hits"] == {"remote": 1} and s["misses"] == {"memory": 1, "disk": 1}
    assert s["remote_fetches"] == 1 and s["remote_bytes"] == refs[0].size
    assert _bytes(cache.get(refs[0])) == data
    s = cache.stats.to_dict()
    assert s["hits"] == {"remote": 1, "memory": 1} and s["remote_fetches"] == 1
    cache.close()
    # a new process (restart): memory is empty, the SSD entry is verified and served
    cache = _cache(tmp_path)
    assert _bytes(cache.get(refs[0])) == data
    s = cache.stats.to_dict()
    assert s["hits"] == {"disk": 1} and s["misses"] == {"memory": 1} and s["remote_fetches"] == 0
    assert _bytes(cache.get(refs[0])) == data
    assert cache.stats.to_dict()["hits"] == {"disk": 1, "memory": 1}
    cache.close()


def test_memory_only_and_budget_eviction(tmp_path):
    refs = make_shards(tmp_path / "src", 4, size=1000)
    cache = _cache(tmp_path, memory=2100, disk=0, policy="lru")
    for r in refs:
        cache.get(r)
    assert cache.mem.used <= 2100 and len(cache.mem.entries) == 2
    assert cache.stats.to_dict()["evictions"] == {"memory": 2}
    cache.get(refs[0])  # was evicted (LRU): fetched again
    assert cache.stats.to_dict()["remote_fetches"] == 5


def test_corrupt_disk_entry_is_discarded_and_refetched(tmp_path):
    refs = make_shards(tmp_path / "src", 1, size=50_000)
    cache = _cache(tmp_path, memory=0)
    good = _bytes(cache.get(refs[0]))
    path = cache.disk.path(cache.disk.entries.__iter__().__next__())
    cache.close()
    raw = bytearray(Path(path).read_bytes())
    raw[1234] ^= 0xFF  # a flipped byte on the SSD (same size: only the CRC can tell)
    Path(path).write_bytes(bytes(raw))
    cache = _cache(tmp_path, memory=0)
    assert _bytes(cache.get(refs[0])) == good
    s = cache.stats.to_dict()
    assert s["corrupt_discarded"] == 1 and s["remote_fetches"] == 1 and s.get("hits") == {"remote": 1}
    assert Path(path).read_bytes() == good  # rewritten intact
    cache.close()


def test_truncated_disk_entry_is_never_served(tmp_path):
    refs = make_shards(tmp_path / "src", 1, size=50_000)
    cache = _cache(tmp_path, memory=0)
    good = _bytes(cache.get(refs[0]))
    path = cache.disk.path(next(iter(cache.disk.entries)))
    cache.close()
    with open(path, "r+b") as f:
        f.truncate(20_000)
    # even when the ref carries no size/CRC, the sidecar's CRC catches it
    bare = ShardRef(url=refs[0].url, key=refs[0].key)
    cache = _cache(tmp_path, memory=0)
    assert _bytes(cache.get(bare)) == good
    assert cache.stats.to_dict()["corrupt_discarded"] == 1
    cache.close()


WRITER = r"""
import sys, zlib
from vlmdata.cache import DiskTier
tier = DiskTier(sys.argv[1], 1 << 30)
def fill(f):
    crc, n = 0, 0
    while True:
        chunk = sys.stdin.buffer.read(1 << 16)
        if not chunk:
            return n, crc & 0xFFFFFFFF
        f.write(chunk); f.flush()
        crc = zlib.crc32(chunk, crc); n += len(chunk)
tier.write(sys.argv[2], fill)
print("committed", flush=True)
"""


def test_kill9_during_cache_write_never_serves_torn_bytes(tmp_path):
    refs = make_shards(tmp_path / "src", 1, size=4 << 20)
    ref = refs[0]
    full = Path(ref.url).read_bytes()
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(ssd), ref.key], stdin=subprocess.PIPE,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    half = len(full) // 2
    proc.stdin.write(full[:half])
    proc.stdin.flush()

    def temp_has_half() -> bool:
        return any(p.name.startswith(".tmp-") and p.stat().st_size >= half for p in ssd.iterdir())

    wait_for(temp_has_half, what="the writer's temp file to hold half the shard")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdin.close()
    assert proc.returncode == -signal.SIGKILL
    assert not any(p.suffix == ".data" for p in ssd.iterdir())  # nothing was published
    cache = _cache(tmp_path, memory=0)
    assert not any(p.name.startswith(".tmp-") for p in ssd.iterdir())  # leftovers cleaned on open
    got = cache.get(ref)
    assert len(got) == len(full) and zlib.crc32(got) & 0xFFFFFFFF == ref.crc32
    assert cache.stats.to_dict()["remote_fetches"] == 1
    cache.close()


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


@pytest.mark.parametrize("key", ["../etc/passwd", "a/../../b", "/etc/passwd", "file:///etc/passwd", "a\x00b",
                                 "C:\\x", "~/x"])
def test_bad_keys_rejected(tmp_path, key):
    cache = _cache(tmp_path)
    with pytest.raises(BadKeyError):
        cache.get(ShardRef(url="s3://b/x.tar", key=key))
    cache.plan(0, [ShardRef(url="s3://b/x.tar", key=key), ShardRef(url="s3://b/y.tar", key="ok")])
    assert cache.plans.plans[0].keys == ["ok"]  # a bad key in a plan is dropped, not fatal
    cache.close()


def test_bad_url_derived_keys_rejected_and_good_ones_hashed(tmp_path):
    from vlmdata.cache import entry_name, key_for

    with pytest.raises(BadKeyError):
        key_for(ShardRef(url="s3://bucket/a/../../b.tar"))
    with pytest.raises(BadKeyError):
        key_for(ShardRef(url="../outside.tar"))
    k = key_for(ShardRef(url="s3://bucket/a/b.tar"))
    assert "/" not in entry_name(k) and "." not in entry_name(k)


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


def test_second_process_cannot_share_a_cache_dir(tmp_path):
    from vlmdata.cache import DiskTier
    from vlmdata.errors import CacheDirBusy

    a = DiskTier(str(tmp_path / "d"), 100)
    with pytest.raises(CacheDirBusy):
        DiskTier(str(tmp_path / "d"), 100)
    a.close()
    DiskTier(str(tmp_path / "d"), 100).close()


def test_config_is_picklable_and_opens(tmp_path):
    import pickle

    refs = make_shards(tmp_path / "src", 2)
    cfg = CacheConfig(memory_bytes=1 << 20, disk_dir=str(tmp_path / "ssd"), disk_bytes=1 << 20, prefetch_bytes=0)
    fetcher = pickle.loads(pickle.dumps(cfg)).open()
    fetcher.plan_ahead(refs)
    assert _bytes(fetcher.get(refs[1])) == Path(refs[1].url).read_bytes()
    assert (tmp_path / "ssd" / "r0-w0").is_dir()  # this process's own share of the SSD tier
    fetcher.close()
    with pytest.raises(ValueError, match="policy"):
        CacheConfig(policy="fifo")
    with pytest.raises(ValueError, match="disk_dir"):
        CacheConfig(disk_bytes=10)


def test_key_equal_to_a_local_url_names_the_object(tmp_path):
    """The dataset passes key=url; for local datasets that is an absolute path, which is fine as a URL."""
    refs = make_shards(tmp_path / "src", 1)
    ref = ShardRef(url=refs[0].url, size=refs[0].size, crc32=refs[0].crc32, key=refs[0].url)
    cache = _cache(tmp_path)
    assert _bytes(cache.get(ref)) == Path(ref.url).read_bytes()
    with pytest.raises(BadKeyError):
        cache.get(ShardRef(url="/x/../etc/passwd", key="/x/../etc/passwd"))
    cache.close()
