"""DirectFetcher: verifies size and CRC32, reports corrupt and missing shards."""
import zlib

import numpy as np
import pytest

from vlmdata.cache import DirectFetcher, RetryPolicy, ShardRef
from vlmdata.errors import CorruptShardError, FetchError


def test_direct_fetcher_verifies_and_reports(tmp_path):
    p = tmp_path / "x.bin"
    payload = np.arange(1000, dtype=np.int32).tobytes()
    p.write_bytes(payload)
    crc = zlib.crc32(payload)
    f = DirectFetcher(retry=RetryPolicy(attempts=2, base_delay=0.0, seed=0))
    assert bytes(f.get(ShardRef(str(p), len(payload), crc))) == payload
    with pytest.raises(CorruptShardError):
        f.get(ShardRef(str(p), len(payload), crc ^ 1))
    with pytest.raises(FetchError, match="not found"):
        f.get(ShardRef(str(tmp_path / "missing.bin")))
