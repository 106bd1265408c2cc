"""The tuning cache: keys per (machine, dataset, pipeline settings), atomic JSON, env override."""
from __future__ import annotations

import json
import os

import pytest

from tests.helpers.tune import ModelRunner
from vlmdata.testing import SyntheticDataset, SyntheticSpec
from vlmdata.tune import (
    LoaderSettings,
    TuneBudget,
    TuneCache,
    TuneConfig,
    cache_key,
    dataset_fingerprint,
    default_cache_path,
    machine_fingerprint,
    tune_cached,
)

CFG = TuneConfig(cpu_count=4)
BUDGET = TuneBudget(memory_bytes=1 << 40)


def _tune(ds, path, **kw):
    runner = ModelRunner(ds.spec)
    result = tune_cached(ds, budget=kw.pop("budget", BUDGET), config=kw.pop("config", CFG),
                         cache_path=path, runner=runner, **kw)
    return result, runner.calls


def test_key_changes_with_pipeline_settings():
    m = machine_fingerprint(4)
    a = dataset_fingerprint(SyntheticDataset(SyntheticSpec(tokens_per_item=1024)))
    b = dataset_fingerprint(SyntheticDataset(SyntheticSpec(tokens_per_item=2048)))
    a2 = dataset_fingerprint(SyntheticDataset(SyntheticSpec(tokens_per_item=1024)))
    assert cache_key(m, a, {}) == cache_key(m, a2, {})
    assert cache_key(m, a, {}) != cache_key(m, b, {})
    assert cache_key(m, a, {}) != cache_key(machine_fingerprint(8), a, {})
    assert cache_key(m, a, {"memory_budget": 1}) != cache_key(m, a, {"memory_budget": 2})


def test_fallback_fingerprint_uses_public_plain_attributes():
    class Plain:
        def __init__(self, max_tokens):
            self.max_tokens = max_tokens
            self.policy = LoaderSettings(1)          # objects with to_dict are described by it
            self._private = object()

    fa, fb = dataset_fingerprint(Plain(8192)), dataset_fingerprint(Plain(4096))
    assert fa["max_tokens"] == 8192 and "_private" not in fa and fa["policy"]["num_workers"] == 1
    assert cache_key({}, fa, {}) != cache_key({}, fb, {})


def test_hit_miss_and_retune_on_changed_settings(tmp_path):
    path = str(tmp_path / "c" / "tune.json")
    ds = SyntheticDataset(SyntheticSpec(item_s=0.02, knee=3, contention=2.0))
    first, calls1 = _tune(ds, path)
    assert calls1 > 0 and not first.from_cache and first.settings.num_workers == 3
    again, calls2 = _tune(ds, path)
    assert calls2 == 0 and again.from_cache and again.settings == first.settings
    other = SyntheticDataset(SyntheticSpec(item_s=0.02, knee=2, contention=2.0))
    changed, calls3 = _tune(other, path)
    assert calls3 > 0 and changed.settings.num_workers == 2
    budget, calls4 = _tune(ds, path, budget=TuneBudget(memory_bytes=1 << 39))
    assert calls4 > 0
    forced, calls5 = _tune(ds, path, force=True)
    assert calls5 > 0
    assert len(TuneCache(path).keys()) == 3
    assert not [f for f in os.listdir(tmp_path / "c") if f.startswith(".tmp-")]   # atomic: no leftovers


def test_env_overrides_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VLMDATA_CACHE_DIR", str(tmp_path / "envcache"))
    assert default_cache_path() == str(tmp_path / "envcache" / "tune.json")
    ds = SyntheticDataset(SyntheticSpec(knee=2))
    _tune(ds, None)
    data = json.loads((tmp_path / "envcache" / "tune.json").read_text())
    entry = next(iter(data["entries"].values()))
    assert entry["about"]["machine"]["cpus"] == 4
    assert entry["result"]["settings"]["num_workers"] == 2
    assert entry["result"]["measurements"]


def test_corrupt_cache_is_replaced(tmp_path, caplog):
    path = tmp_path / "tune.json"
    path.write_text("{not json")
    ds = SyntheticDataset(SyntheticSpec(knee=2))
    result, calls = _tune(ds, str(path))
    assert calls > 0 and result.settings.num_workers == 2
    assert "not valid JSON" in caplog.text
    assert json.loads(path.read_text())["version"] == 1


def test_a_cache_folder_or_file_of_another_user_is_refused(tmp_path):
    from vlmdata.errors import UnsafePathError

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 12345, 12345)                          # results there would pick our worker counts
    ds = SyntheticDataset(SyntheticSpec(knee=2))
    with pytest.raises(UnsafePathError, match="uid 12345"):
        _tune(ds, str(theirs / "tune.json"))
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "tune.json").write_text(json.dumps({"version": 1, "entries": {}}))
    os.chown(ours / "tune.json", 12345, 12345)
    with pytest.raises(UnsafePathError, match="uid 12345"):
        _tune(ds, str(ours / "tune.json"))
