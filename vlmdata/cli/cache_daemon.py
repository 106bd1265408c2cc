"""`vlmdata cache-daemon`: the per-node shard cache every local reader goes through."""
from __future__ import annotations

import argparse
import logging
import signal
import threading

from vlmdata.cache.daemon.budget import ReaderWindows
from vlmdata.cache.daemon.server import CacheDaemon, ConnectionLimits, DaemonOptions
from vlmdata.cli.options import parse_storage_options
from vlmdata.errors import ConfigError
from vlmdata.retry import DEFAULT_DEADLINE, RetryPolicy

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
    p.add_argument("--allow", nargs="+", action="extend", default=[], metavar="PREFIX",
                   help="dataset folders or URL prefixes to serve (repeatable); without it, the datasets readers "
                        "register over the Unix socket are served. Nothing else is ever read.")
    p.add_argument("--token-file", help="where to write the TCP listener's token (0600; default: SOCKET.token, "
                                        "else CACHE_DIR/daemon.token); readers give it as daemon_token_file")
    p.add_argument("--max-connections", type=int, default=ConnectionLimits.max_connections,
                   help="connections served at once; more are refused and those readers fetch directly")
    p.add_argument("--idle-timeout", type=float, default=ConnectionLimits.idle_timeout,
                   help="seconds before a silent connection is closed (readers reconnect transparently)")
    p.add_argument("--retry-deadline", type=float, default=DEFAULT_DEADLINE,
                   help="seconds a failing object-store read is retried before the shard is given up "
                        f"(default {DEFAULT_DEADLINE:.0f}: long enough for a typical outage)")
    sizing = p.add_argument_group("budget report (what the readers' windows need; logged at start and exported "
                                  "as vlmdata_cache_budget_needed_bytes)")
    sizing.add_argument("--window-shards", type=int, default=ReaderWindows.window_shards,
                        help="VLMDataset window_shards of the readers (default %(default)s)")
    sizing.add_argument("--workers", type=int, default=ReaderWindows.workers,
                        help="DataLoader workers per rank (default %(default)s)")
    sizing.add_argument("--local-ranks", type=int, default=ReaderWindows.local_ranks,
                        help="training ranks on this node (default %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.socket and args.tcp_port is None:
        raise SystemExit("cache-daemon: give --socket PATH (recommended) or --tcp-port PORT")
    try:
        limits = ConnectionLimits(max_connections=args.max_connections, idle_timeout=args.idle_timeout)
        windows = ReaderWindows(args.window_shards, args.workers, args.local_ranks)
        retry = RetryPolicy(deadline=args.retry_deadline)
    except ValueError as exc:
        raise SystemExit(f"cache-daemon: {exc}") from None
    opts = DaemonOptions(cache_dir=args.cache_dir, disk_bytes=args.disk_bytes, socket_path=args.socket,
                         tcp_port=args.tcp_port, policy=args.policy, prefetch_bytes=args.prefetch_bytes,
                         prefetch_threads=args.prefetch_threads,
                         storage_options=parse_storage_options(args.storage_options), retry=retry,
                         allow=list(args.allow), token_file=args.token_file, limits=limits, windows=windows)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        daemon = CacheDaemon(opts)
    except ConfigError as exc:
        raise SystemExit(f"cache-daemon: {exc}") from None
    metrics_server = None
    try:
        daemon.start()
        if args.metrics_port is not None:
            from vlmdata.metrics.server import MetricsServer

            metrics_server = MetricsServer(daemon.metrics, port=args.metrics_port, host=args.metrics_host)
            print(f"metrics: {metrics_server.url}", flush=True)
        where = args.socket or f"tcp://127.0.0.1:{daemon.tcp_address[1]}"
        print(f"cache daemon ready on {where}", flush=True)
        if daemon.token is not None:
            print(f"tcp://127.0.0.1:{daemon.tcp_address[1]} token file: {daemon.token.path}", flush=True)
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
