"""CacheConfig: picklable (it travels to DataLoader workers), opens a fetcher, rejects bad settings."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cache import as_bytes as _bytes
from tests.helpers.cache import make_shards
from vlmdata.cache import CacheConfig


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
