"""Tiers: hits per tier, the memory budget, verification and crash safety of the SSD tier, one process per
cache directory."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from tests.helpers.cache import as_bytes as _bytes
from tests.helpers.cache import make_shards, wait_for
from tests.helpers.cache import tiered_cache as _cache
from tests.helpers.paths import REPO
from vlmdata.cache import ShardRef


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


def test_second_process_cannot_share_a_cache_dir(tmp_path):
    from vlmdata.cache import DiskTier
    from vlmdata.errors import CacheDirBusy

    a = DiskTier(str(tmp_path / "d"), 100)
    with pytest.raises(CacheDirBusy):
        DiskTier(str(tmp_path / "d"), 100)
    a.close()
    DiskTier(str(tmp_path / "d"), 100).close()
