"""`vlmdata cache-daemon`: the per-node shard cache every local reader goes through."""
from __future__ import annotations

import argparse
import logging
import signal
import threading

from vlmdata.cache.daemon.server import CacheDaemon, DaemonOptions
from vlmdata.cli.options import parse_storage_options

log = logging.getLogger(__name__)


def _size(text: str) -> int:
    """Bytes from '123', '64M', '100G', '1.5T'."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)



def register(subparsers) -> None:
    p = subparsers.add_parser("cache-daemon", help="run the per-node shard cache daemon",
                              description="Serve shards to every local reader from one SSD cache: each shard is "
                                          "fetched from the object store once per node.")
    p.add_argument("--cache-dir", required=True, help="SSD cache directory (created 0700)")
    p.add_argument("--disk-bytes", required=True, type=_size, help="SSD budget, e.g. 500G")
    p.add_argument("--socket", help="Unix socket path (created mode 0600)")
    p.add_argument("--tcp-port", type=int, help="also listen on 127.0.0.1:PORT (loopback only)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on METRICS_HOST:PORT")
    p.add_argument("--metrics-host", default=None,
                   help="address the metrics server binds (default: $VLMDATA_METRICS_HOST, else 127.0.0.1; "
                        "0.0.0.0 lets other containers scrape it)")
    p.add_argument("--policy", choices=("belady", "lru"), default="belady")
    p.add_argument("--prefetch-bytes", type=_size, default=4 << 30, help="prefetch lookahead budget")
    p.add_argument("--prefetch-threads", type=int, default=8)
    p.add_argument("--storage-options", help="fsspec options as JSON, or @file.json")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.socket and args.tcp_port is None:
        raise SystemExit("cache-daemon: give --socket PATH (recommended) or --tcp-port PORT")
    opts = DaemonOptions(cache_dir=args.cache_dir, disk_bytes=args.disk_bytes, socket_path=args.socket,
                         tcp_port=args.tcp_port, policy=args.policy, prefetch_bytes=args.prefetch_bytes,
                         prefetch_threads=args.prefetch_threads,
                         storage_options=parse_storage_options(args.storage_options))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    daemon = CacheDaemon(opts)
    metrics_server = None
    try:
        daemon.start()
        if args.metrics_port is not None:
            from vlmdata.metrics.server import MetricsServer

            metrics_server = MetricsServer(daemon.metrics, port=args.metrics_port, host=args.metrics_host)
            print(f"metrics: {metrics_server.url}", flush=True)
        where = args.socket or f"tcp://127.0.0.1:{daemon.tcp_address[1]}"
        print(f"cache daemon ready on {where}", flush=True)
        # Wake up regularly: a signal delivered to another thread only runs its Python handler once the
        # main thread executes bytecode again, so an untimed wait could sleep through SIGTERM.
        while not stop.wait(0.2):
            pass
        log.info("stopping cache daemon")
    finally:
        if metrics_server is not None:
            metrics_server.close()
        daemon.stop()
    return 0
