"""Helpers for the cache tests: local shard files, shards in S3, a daemon subprocess, tiered caches."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import time
import zlib
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.paths import REPO
from vlmdata.cache import CacheConfig, RetryPolicy, ShardCache, ShardRef
from vlmdata.cache.daemon import DaemonClient, connect

FAST_RETRY = RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.002)


def make_shards(root: Path, n: int, size: int = 4096, seed: int = 0) -> list[ShardRef]:
    """`n` files of random bytes under `root`, with refs carrying their size and CRC32."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    refs = []
    for i in range(n):
        data = rng.randbytes(size + i)
        p = root / f"shard-{i:04d}.tar"
        p.write_bytes(data)
        refs.append(ShardRef(url=str(p), size=len(data), crc32=zlib.crc32(data) & 0xFFFFFFFF, key=f"ds/shard-{i:04d}"))
    return refs


def equal_shards(root: Path, n: int, size: int = 1000):
    refs = make_shards(root, n, size=size)
    # make_shards grows each shard by its index; rewrite them to one size
    out = []
    for r in refs:
        data = Path(r.url).read_bytes()[:size]
        Path(r.url).write_bytes(data)
        out.append(type(r)(url=r.url, size=size, crc32=zlib.crc32(data) & 0xFFFFFFFF, key=r.key))
    return out


def upload_shards(opts: dict, bucket: str, n: int, size: int = 4096, seed: int = 0) -> list[ShardRef]:
    """Create `bucket` and `n` objects in it; refs with size and CRC32."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
    fs.mkdir(bucket)
    rng = random.Random(seed)
    refs = []
    for i in range(n):
        data = rng.randbytes(size + i)
        fs.pipe_file(f"{bucket}/shard-{i:04d}.tar", data)
        refs.append(ShardRef(url=f"s3://{bucket}/shard-{i:04d}.tar", size=len(data),
                             crc32=zlib.crc32(data) & 0xFFFFFFFF))
    return refs


def as_bytes(v) -> bytes:
    return bytes(v[:]) if not isinstance(v, bytes) else v


def tiered_cache(tmp_path: Path, memory: int = 1 << 20, disk: int = 1 << 20, **kw) -> ShardCache:
    """A ShardCache with a memory tier and (unless disk=0) an SSD tier under tmp_path/ssd; no prefetch by default."""
    cfg = CacheConfig(memory_bytes=memory, disk_dir=str(tmp_path / "ssd") if disk else None, disk_bytes=disk,
                      prefetch_bytes=kw.pop("prefetch_bytes", 0), retry=FAST_RETRY, **kw)
    return ShardCache(cfg, disk_dir=cfg.disk_dir)


def daemon_client(address: str, **kw) -> DaemonClient:
    return DaemonClient(CacheConfig(daemon=address, memory_bytes=1 << 20, prefetch_bytes=0, retry=FAST_RETRY, **kw))


def listening_on(port: int) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp) listening on `port`."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            addr, p = f[1].rsplit(":", 1)
            if int(p, 16) == port and f[3] == "0A":
                out.append(addr)
    return out


def wait_for(cond, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll `cond()` until true (a condition wait, not a fixed sleep); fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _daemon_answers(sock_path: str) -> bool:
    try:
        connect(sock_path, timeout=1).close()
        return True
    except OSError:
        return False


@contextmanager
def daemon_process(cache_dir: Path, sock: Path, disk_bytes: int, extra: list[str] | None = None):
    """`vlmdata cache-daemon` in a subprocess; yields the Popen once the socket answers."""
    cmd = [sys.executable, "-m", "vlmdata", "cache-daemon", "--cache-dir", str(cache_dir),
           "--disk-bytes", str(disk_bytes), "--socket", str(sock), *(extra or [])]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: proc.poll() is not None or _daemon_answers(str(sock)), what="daemon socket")
        assert proc.poll() is None, proc.stderr.read()
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
