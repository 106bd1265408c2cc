"""Opening an SSD cache directory: stray and invalid items are logged and skipped (never fatal, never served),
our own leftovers are removed once, and a smaller budget shrinks the cache at start."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from tests.helpers.cache import as_bytes as _bytes
from tests.helpers.cache import make_shards
from tests.helpers.cache import tiered_cache as _cache


def test_start_over_stray_and_invalid_items(tmp_path, caplog):
    refs = make_shards(tmp_path / "src", 3, size=5000)
    cache = _cache(tmp_path, memory=0)
    for r in refs:
        cache.get(r)
    stems = sorted(e.name for e in cache.disk.entries.values())
    cache.close()
    ssd = tmp_path / "ssd"
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 5000)
    strays = ["a" * 40 + ".meta", "b" * 40 + ".data", ".tmp-dir"]
    for name in strays:                                       # directories named like our files
        (ssd / name).mkdir()
    (ssd / "notes.txt").write_text("an operator's file")
    (ssd / ("c" * 40 + ".meta")).write_text(json.dumps({"key": "ds/x", "size": 5000, "crc32": 1}))
    os.symlink(secret, ssd / ("c" * 40 + ".data"))            # a link named like an entry's data
    (ssd / f"{stems[0]}.meta").write_text("{not json")          # an invalid .meta beside its .data
    (ssd / ".tmp-1234").write_bytes(b"half a write")
    with caplog.at_level(logging.INFO):
        cache = _cache(tmp_path, memory=0)                    # starts
    assert len(cache.disk.entries) == 2 and all(e.name != stems[0] for e in cache.disk.entries.values())
    assert not (ssd / f"{stems[0]}.meta").exists() and not (ssd / f"{stems[0]}.data").exists()
    assert not (ssd / ".tmp-1234").exists()
    assert all((ssd / n).is_dir() for n in strays) and (ssd / "notes.txt").exists()   # not ours: left alone
    assert (ssd / ("c" * 40 + ".data")).is_symlink() and secret.read_bytes() == b"s" * 5000
    assert "did not write" in caplog.text
    assert [_bytes(cache.get(r)) for r in refs] == [Path(r.url).read_bytes() for r in refs]
    assert cache.stats.to_dict()["hits"] == {"disk": 2, "remote": 1}
    cache.close()


def test_restart_with_a_smaller_budget_shrinks_the_cache(tmp_path):
    refs = make_shards(tmp_path / "src", 5, size=10_000)
    cache = _cache(tmp_path, memory=0, disk=1 << 20)
    for r in refs:
        cache.get(r)
    paths = [cache.disk.path(k) for k in cache.disk.entries]
    cache.close()
    for age, p in enumerate(paths):                           # least recently written first
        os.utime(p, (1_000_000 + age, 1_000_000 + age))
    cache = _cache(tmp_path, memory=0, disk=25_000)
    assert cache.disk.used <= 25_000 and len(cache.disk.entries) == 2
    assert sorted(cache.disk.path(k) for k in cache.disk.entries) == sorted(paths[3:])   # the newest kept
    assert sorted(p for p in paths if Path(p).exists()) == sorted(paths[3:])           # and the rest deleted
    assert cache.stats.to_dict()["evictions"] == {"disk": 3}
    cache.close()
