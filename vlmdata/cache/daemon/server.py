"""The per-node cache daemon: one SSD tier shared by every reader on the node.

Readers (ranks, DataLoader workers) connect over a Unix socket (mode 0600) or 127.0.0.1 TCP,
send their plans, and ask for shards; the daemon makes sure the shard is in its SSD tier
(single-flight, so each shard is fetched from the object store once per node) and replies with
the file's path. The reader mmaps the file itself: no shard bytes cross the socket. The entry a
connection was last given stays pinned until that connection's next request (by then the
reader has mapped it; an open mapping survives a later unlink on Linux anyway). Plans of all
connections are merged for Belady eviction and prefetch. A restarted daemon reuses (and
verifies on first use) what is already in its cache directory.
"""
from __future__ import annotations

import itertools
import logging
import os
import socket
import socketserver
import stat
import threading
from dataclasses import dataclass, field

from vlmdata.cache.config import CacheConfig
from vlmdata.cache.daemon.protocol import recv_msg, ref_from_wire, send_msg
from vlmdata.cache.fetch import RetryPolicy
from vlmdata.cache.keys import key_for
from vlmdata.cache.shard_cache import ShardCache
from vlmdata.errors import BadKeyError, FetchError, ProtocolError
from vlmdata.metrics.registry import MetricSet

log = logging.getLogger(__name__)


@dataclass
class DaemonOptions:
    """What `vlmdata cache-daemon` is given."""

    cache_dir: str
    disk_bytes: int
    socket_path: str | None = None
    tcp_port: int | None = None          # binds 127.0.0.1 only; 0 = any free port
    policy: str = "belady"
    prefetch_bytes: int = 4 << 30
    prefetch_threads: int = 8
    storage_options: dict = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _TCPServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


def _claim_socket_path(path: str) -> None:
    """Remove a stale socket left by a dead daemon; refuse if a live daemon answers there."""
    if not os.path.lexists(path):
        return
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise FileExistsError(f"{path} exists and is not a socket; choose another --socket path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)
        return
    finally:
        probe.close()
    raise RuntimeError(f"a cache daemon is already listening on {path}")


class CacheDaemon:
    """Serves a ShardCache to local readers. `start()`, then `stop()` (idempotent)."""

    def __init__(self, opts: DaemonOptions, metrics: MetricSet | None = None):
        if not opts.socket_path and opts.tcp_port is None:
            raise ValueError("the cache daemon needs a --socket path or a --tcp-port")
        self.opts = opts
        self.metrics = metrics or MetricSet(rank_labels=False)
        cfg = CacheConfig(memory_bytes=0, disk_dir=opts.cache_dir, disk_bytes=opts.disk_bytes,
                          policy=opts.policy, prefetch_bytes=opts.prefetch_bytes,
                          prefetch_threads=opts.prefetch_threads, storage_options=opts.storage_options,
                          retry=opts.retry)
        self.cache = ShardCache(cfg, metrics=self.metrics)
        self._servers: list[socketserver.BaseServer] = []
        self._threads: list[threading.Thread] = []
        self._ids = itertools.count()
        self._stopped = False
        self.tcp_address: tuple[str, int] | None = None

    def start(self) -> None:
        handler = self._handler_class()
        if self.opts.socket_path:
            path = os.path.abspath(self.opts.socket_path)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _claim_socket_path(path)
            old = os.umask(0o177)  # the socket is created 0600: no window where others could connect
            try:
                server = _UnixServer(path, handler)
            finally:
                os.umask(old)
            os.chmod(path, 0o600)
            self._servers.append(server)
            log.info("cache daemon listening on unix socket %s", path)
        if self.opts.tcp_port is not None:
            server = _TCPServer(("127.0.0.1", int(self.opts.tcp_port)), handler)
            self.tcp_address = server.server_address
            self._servers.append(server)
            log.info("cache daemon listening on tcp://%s:%d", *self.tcp_address)
        for s in self._servers:
            t = threading.Thread(target=s.serve_forever, name="vlmdata-cache-daemon", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop accepting, close the sockets, remove the socket file, release the cache dir."""
        if self._stopped:
            return
        self._stopped = True
        for s in self._servers:
            s.shutdown()
            s.server_close()
        if self.opts.socket_path and os.path.lexists(self.opts.socket_path):
            os.unlink(self.opts.socket_path)
        self.cache.close()
        log.info("cache daemon stopped: %s", self.cache.stats.to_dict())

    # -- one connection --------------------------------------------------------------------------
    def _handler_class(self):
        daemon = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                daemon._serve_connection(self.request)

        return Handler

    def _serve_connection(self, sock: socket.socket) -> None:
        reader = next(self._ids)
        pinned: str | None = None
        try:
            while True:
                try:
                    msg = recv_msg(sock)
                except ProtocolError as exc:
                    send_msg(sock, {"ok": False, "error": "bad_request", "message": str(exc)})
                    return
                if msg is None:
                    return
                if pinned is not None:  # the reader has mapped the last file by now
                    self.cache.unpin(pinned)
                    pinned = None
                reply, pinned = self._answer(reader, msg)
                send_msg(sock, reply)
        except (ConnectionError, OSError) as exc:
            log.debug("reader %d disconnected: %s", reader, exc)
        finally:
            if pinned is not None:
                self.cache.unpin(pinned)
            self.cache.drop_reader(reader)

    def _answer(self, reader: int, msg: dict) -> tuple[dict, str | None]:
        op = msg.get("op")
        try:
            if op == "get":
                ref = ref_from_wire(msg.get("ref"))
                key = key_for(ref)
                path, size = self.cache.get_path(ref, reader)
                return {"ok": True, "path": path, "size": size}, key
            if op == "plan":
                refs = msg.get("refs")
                if not isinstance(refs, list):
                    raise ProtocolError("plan.refs must be a list")
                self.cache.plan(reader, [ref_from_wire(r) for r in refs])
                return {"ok": True}, None
            if op == "stats":
                return {"ok": True, "stats": self.cache.stats.to_dict()}, None
            if op == "ping":
                return {"ok": True}, None
            raise ProtocolError(f"unknown op {op!r}")
        except BadKeyError as exc:
            return {"ok": False, "error": "bad_key", "message": str(exc)}, None
        except ProtocolError as exc:
            return {"ok": False, "error": "bad_request", "message": str(exc)}, None
        except FetchError as exc:
            return {"ok": False, "error": "fetch", "message": str(exc)}, None
