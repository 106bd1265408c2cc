"""Helpers for the cache tests: local shard files, a moto S3 server, a daemon subprocess."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import time
import zlib
from contextlib import contextmanager
from pathlib import Path

from vlmdata.cache import ShardRef
from vlmdata.cache.daemon import connect

REPO = Path(__file__).resolve().parents[1]


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


@contextmanager
def moto_s3():
    """A real S3 API on 127.0.0.1 (moto's server); yields s3fs storage_options."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    opts = {"endpoint_url": f"http://{host}:{port}", "key": "testing", "secret": "testing", "anon": False,
            "client_kwargs": {"region_name": "us-west-2"}}
    try:
        yield opts
    finally:
        server.stop()


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
