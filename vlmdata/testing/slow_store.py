"""A slow object store for benchmarks: moto's S3 server behind a latency and bandwidth-limiting proxy.

`SlowStore()` starts a helper process running moto's S3 server on 127.0.0.1 behind an asyncio
TCP proxy that delays every HTTP request by a fixed latency and throttles the bytes it sends
back (one shared link), and counts requests, GETs and bytes sent: the "object store" as a
reader sees it. `set(latency_s, bandwidth_Bps)` changes the link, `reset()` / `stats()` read
the counters, `options()` gives s3fs storage options (through the proxy, or straight to moto
with `direct=True` for uploads). Used by tools/bench_cache.py and tools/bench_data_wait.py.

    python -m vlmdata.testing.slow_store      # the helper process (prints its ports, reads commands)
"""
from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import threading
import zlib

__all__ = ["BUCKET", "Proxy", "SlowStore", "serve_store", "upload_random"]

BUCKET = "bench"


class Proxy:
    """TCP proxy: delays each HTTP request by `latency` s, throttles responses to `bandwidth` B/s."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.latency = 0.0
        self.bandwidth = 0.0  # bytes/s, 0 = unlimited
        self.requests = 0
        self.gets = 0
        self.bytes_down = 0
        self._link_free = 0.0

    async def _throttle(self, n: int) -> None:
        if self.bandwidth <= 0:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._link_free = max(now, self._link_free) + n / self.bandwidth
        await asyncio.sleep(self._link_free - now)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def client_to_server() -> None:
            while data := await reader.read(1 << 16):
                if data[:4] in (b"GET ", b"HEAD", b"PUT ", b"POST", b"DELE"):
                    self.requests += 1
                    self.gets += data.startswith(b"GET ")
                    if self.latency:
                        await asyncio.sleep(self.latency)
                up_w.write(data)
                await up_w.drain()

        async def server_to_client() -> None:
            while data := await up_r.read(1 << 16):
                self.bytes_down += len(data)
                await self._throttle(len(data))
                writer.write(data)
                await writer.drain()

        tasks = [asyncio.ensure_future(client_to_server()), asyncio.ensure_future(server_to_client())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except (ConnectionError, OSError):
            pass
        finally:
            for t in tasks:
                t.cancel()
            for w in (writer, up_w):
                w.close()


def serve_store() -> None:
    """Entry of the store process: prints {"moto": port, "proxy": port}, then answers stdin commands."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    _, moto_port = moto.get_host_and_port()
    proxy = Proxy(moto_port)

    async def main() -> None:
        server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        print(json.dumps({"moto": moto_port, "proxy": port}), flush=True)
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def commands() -> None:
            for line in sys.stdin:
                parts = line.split()
                if not parts:
                    continue
                if parts[0] == "set":  # set LATENCY_S BANDWIDTH_BPS
                    proxy.latency, proxy.bandwidth = float(parts[1]), float(parts[2])
                elif parts[0] == "reset":
                    proxy.requests = proxy.gets = proxy.bytes_down = 0
                print(json.dumps({"requests": proxy.requests, "gets": proxy.gets, "bytes_down": proxy.bytes_down}),
                      flush=True)
            loop.call_soon_threadsafe(done.set)

        threading.Thread(target=commands, daemon=True).start()
        await done.wait()
        server.close()

    asyncio.run(main())
    moto.stop()


class SlowStore:
    """Client side of the store process."""

    def __init__(self, cwd: str | None = None):
        self.proc = subprocess.Popen([sys.executable, "-m", "vlmdata.testing.slow_store"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=cwd)
        ports = json.loads(self.proc.stdout.readline())
        self.moto_port, self.proxy_port = ports["moto"], ports["proxy"]

    def _cmd(self, line: str) -> dict:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def set(self, latency: float, bandwidth: float) -> None:
        self._cmd(f"set {latency} {bandwidth}")

    def reset(self) -> dict:
        return self._cmd("reset")

    def stats(self) -> dict:
        return self._cmd("stats")

    def options(self, direct: bool = False) -> dict:
        port = self.moto_port if direct else self.proxy_port
        return {"endpoint_url": f"http://127.0.0.1:{port}", "key": "bench", "secret": "bench", "anon": False,
                "client_kwargs": {"region_name": "us-west-2"}}

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


def upload_random(store: SlowStore, prefix: str, n: int, size: int, seed: int) -> list:
    """n equal-size objects of random bytes, written straight to moto (not through the proxy)."""
    import s3fs

    from vlmdata.cache.fetch import ShardRef

    fs = s3fs.S3FileSystem(**store.options(direct=True))
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    rng = random.Random(seed)
    refs = []
    for i in range(n):
        data = rng.randbytes(size)
        url = f"s3://{BUCKET}/{prefix}/shard-{i:05d}.tar"
        fs.pipe_file(url[len("s3://"):], data)
        refs.append(ShardRef(url=url, size=size, crc32=zlib.crc32(data) & 0xFFFFFFFF, key=f"{prefix}/{i:05d}"))
    return refs


if __name__ == "__main__":
    serve_store()
