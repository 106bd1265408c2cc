"""Cache pressure never loses data: an entry a reader asked for cannot be evicted before it is pinned, pinned
entries are never evicted, and when pinned entries fill the SSD budget the reader is told to read directly."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cache import make_shards
from tests.helpers.cache import tiered_cache as _cache
from vlmdata.cache import key_for
from vlmdata.errors import NoRoomError


def test_an_entry_being_handed_out_survives_concurrent_inserts(tmp_path, monkeypatch):
    """The issue's race, made deterministic: between loading a reader's shard and pinning it, another insert
    (the prefetcher, another reader) overfills the budget; Belady would evict the shard just read."""
    refs = make_shards(tmp_path / "src", 8, size=10_000)
    cache = _cache(tmp_path, memory=0, disk=15_000)          # room for one shard
    cache.plan(0, refs)
    real_load = cache._load
    others = iter(refs[2:])

    def racing_load(ref, key, prefetch, protect=False):
        value = real_load(ref, key, prefetch, protect)
        if not prefetch:                                      # what happens concurrently in the daemon
            other = next(others, None)
            if other is not None:
                real_load(other, key_for(other), True)
        return value

    monkeypatch.setattr(cache, "_load", racing_load)
    path, size = cache.get_path(refs[0], reader=0)
    assert size == refs[0].size and Path(path).read_bytes() == Path(refs[0].url).read_bytes()
    assert key_for(refs[0]) in cache.disk.entries and cache.disk.used <= 15_000
    cache.unpin(key_for(refs[0]))
    cache.close()


def test_when_pinned_entries_fill_the_budget_readers_read_through(tmp_path):
    refs = make_shards(tmp_path / "src", 3, size=10_000)
    cache = _cache(tmp_path, memory=0, disk=15_000)
    path, _ = cache.get_path(refs[0], reader=0)               # pinned by reader 0
    with pytest.raises(NoRoomError, match="read it directly"):
        cache.get_path(refs[1], reader=1)                     # no room beside it: nothing evicted, nothing written
    assert Path(path).read_bytes() == Path(refs[0].url).read_bytes()
    assert cache.stats.to_dict()["read_through"] == 1 and cache.disk.used <= 15_000
    cache.unpin(key_for(refs[0]))
    path, _ = cache.get_path(refs[1], reader=1)               # released: room again
    assert Path(path).read_bytes() == Path(refs[1].url).read_bytes()
    cache.close()
