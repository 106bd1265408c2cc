"""The cache's remote fetches against a real S3 API (moto's server on 127.0.0.1) through s3fs: tiers, checksums,
the daemon, a store that went away."""
from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.cache import upload_shards
from tests.helpers.s3 import moto_s3
from vlmdata.cache import CacheConfig, RetryPolicy, ShardCache, ShardRef
from vlmdata.cache.daemon import CacheDaemon, DaemonClient, DaemonOptions
from vlmdata.errors import FetchError

pytestmark = pytest.mark.integration  # moto's S3 server

FAST_RETRY = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02)


def _opts(opts: dict) -> dict:
    return {**opts, "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 10}}


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as opts:
        refs = upload_shards(opts, "cache-test", 6, size=30_000)
        yield _opts(opts), refs


def test_tiered_cache_over_s3_verifies_and_reuses_ssd(s3, tmp_path):
    opts, refs = s3
    cfg = CacheConfig(memory_bytes=1 << 20, disk_dir=str(tmp_path / "ssd"), disk_bytes=1 << 20, prefetch_bytes=1 << 20,
                      storage_options=opts, retry=FAST_RETRY)
    cache = ShardCache(cfg, disk_dir=cfg.disk_dir)
    cache.plan(0, refs)
    first = [bytes(cache.get(r)) for r in refs]
    assert [len(b) for b in first] == [r.size for r in refs]
    s = cache.stats.to_dict()
    assert s["remote_fetches"] == len(refs) and s["remote_bytes"] == sum(r.size for r in refs)
    cache.close()
    cache = ShardCache(cfg, disk_dir=cfg.disk_dir)
    assert [bytes(cache.get(r)) for r in refs] == first
    s = cache.stats.to_dict()
    assert s["remote_fetches"] == 0 and s["hits"] == {"disk": len(refs)}
    cache.close()


def test_missing_object_and_wrong_checksum_are_fetch_errors(s3, tmp_path):
    opts, refs = s3
    cache = ShardCache(CacheConfig(memory_bytes=1 << 20, prefetch_bytes=0, storage_options=opts, retry=FAST_RETRY))
    with pytest.raises(FetchError):
        cache.get(ShardRef(url="s3://cache-test/nope.tar", size=10, crc32=1))
    with pytest.raises(FetchError):
        cache.get(ShardRef(url=refs[0].url, size=refs[0].size, crc32=(refs[0].crc32 ^ 1), key="bad-crc"))
    assert cache.stats.to_dict()["fetch_errors"] == 2


def test_daemon_over_s3_fetches_once_per_node(s3, tmp_path):
    opts, refs = s3
    sockdir = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp"))
    d = CacheDaemon(DaemonOptions(cache_dir=str(tmp_path / "ssd"), disk_bytes=1 << 22, socket_path=str(sockdir / "s"),
                                  prefetch_bytes=1 << 20, storage_options=opts, retry=FAST_RETRY))
    d.start()
    results: dict[int, list[bytes]] = {}

    def reader(i: int) -> None:
        c = DaemonClient(CacheConfig(daemon=str(sockdir / "s"), storage_options=opts, retry=FAST_RETRY))
        c.plan_ahead(refs)
        results[i] = [bytes(c.get(r)) for r in refs]
        c.close()

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    s = d.cache.stats.to_dict()
    d.stop()
    sockdir.rmdir()
    assert len(results) == 3 and results[0] == results[1] == results[2]
    assert [len(b) for b in results[0]] == [r.size for r in refs]
    assert s["remote_fetches"] == len(refs)


def test_store_down_is_a_fetch_error_not_a_hang(tmp_path):
    with moto_s3() as opts:
        refs = upload_shards(opts, "gone", 1)
    cache = ShardCache(CacheConfig(memory_bytes=1 << 20, prefetch_bytes=0, storage_options=_opts(opts),
                                   retry=FAST_RETRY))
    t0 = time.monotonic()
    with pytest.raises(FetchError):
        cache.get(refs[0])
    assert time.monotonic() - t0 < 60
