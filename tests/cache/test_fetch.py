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


class CountingReads:
    """Records how many bytes each read of the fetcher returned (fsutil's range reads and streamed files)."""

    def __init__(self, monkeypatch):
        import vlmdata.fsutil as fsutil_mod

        self.sizes: list[int] = []
        real_range, real_open = fsutil_mod.read_range, fsutil_mod.open_url

        def read_range(url, start, end, storage_options=None):
            data = real_range(url, start, end, storage_options)
            self.sizes.append(len(data))
            return data

        class Counted:
            def __init__(self, f, sizes):
                self.f, self.sizes = f, sizes

            def read(self, n=-1):
                data = self.f.read(n)
                self.sizes[-1] += len(data)
                return data

        class Opened:
            def __init__(self, ctx, sizes):
                self.ctx, self.sizes = ctx, sizes

            def __enter__(self):
                self.sizes.append(0)
                return Counted(self.ctx.__enter__(), self.sizes)

            def __exit__(self, *exc):
                return self.ctx.__exit__(*exc)

        monkeypatch.setattr(fsutil_mod, "read_range", read_range)
        monkeypatch.setattr(fsutil_mod, "open_url", lambda *a, **k: Opened(real_open(*a, **k), self.sizes))


def test_reads_stop_at_the_declared_size_and_at_the_limit(tmp_path, monkeypatch):
    big = tmp_path / "big.tar"
    with open(big, "wb") as f:
        f.truncate(64 << 20)                                 # 64 MiB (sparse)
    reads = CountingReads(monkeypatch)
    fetcher = DirectFetcher(retry=RetryPolicy(attempts=1), max_bytes=1 << 20)
    with pytest.raises(CorruptShardError, match="more than its declared 70000 bytes"):
        fetcher.get(ShardRef(str(big), size=70_000))
    with pytest.raises(FetchError, match="limit"):           # no declared size: at most the limit
        fetcher.get(ShardRef(str(big)))
    fetcher.whole_object_bytes = 1 << 16                     # large declared sizes are streamed into the file
    out = tmp_path / "out"
    with open(out, "wb+") as f, pytest.raises(CorruptShardError, match="more than its declared"):
        fetcher.fetch_to(ShardRef(str(big), size=300_000), f)
    # never the whole 64 MiB: a local file's gets are refused from its size (it is mapped, not read);
    # the stream into the file stops one byte past the declared size
    assert reads.sizes == [300_001]
    assert out.stat().st_size <= 300_001


ENDLESS = r"""
import os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from vlmdata.cache import DirectFetcher, RetryPolicy, ShardRef
from vlmdata.errors import FetchError
fetcher = DirectFetcher(retry=RetryPolicy(attempts=1))
for url in sys.argv[1:]:
    try:
        fetcher.get(ShardRef(url))
        print("read", url)
    except FetchError as exc:
        print("refused", exc)
"""


def test_devices_and_fifos_are_refused_without_reading(tmp_path):
    import os
    import subprocess
    import sys

    from tests.helpers.paths import REPO

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)                                          # opening it for reading would block forever
    out = subprocess.run([sys.executable, "-c", ENDLESS, "/dev/zero", str(fifo)], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("refused") and "not a regular file" in line for line in lines)
