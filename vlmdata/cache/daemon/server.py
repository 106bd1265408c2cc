"""The per-node cache daemon: one SSD tier shared by every reader on the node.

Readers (ranks, DataLoader workers) connect over a Unix socket (mode 0600) or 127.0.0.1 TCP,
send their plans, and ask for shards; the daemon makes sure the shard is in its SSD tier
(single-flight, so each shard is fetched from the object store once per node) and replies with
the file's path. The reader mmaps the file itself: no shard bytes cross the socket. The entry a
connection was last given stays pinned until that connection's next request (by then the
reader has mapped it; an open mapping survives a later unlink on Linux anyway). Plans of all
connections are merged for Belady eviction and prefetch. A restarted daemon reuses (and
verifies on first use) what is already in its cache directory, and shrinks it to its budget.

Hardening (the daemon reads with its own user's rights on behalf of local clients):

- it serves only its datasets (`access.DatasetAccess`): `--allow PREFIX...`, or the datasets its
  clients register over the 0600 Unix socket; anything else is refused before it is touched, with
  one message whether it exists or not;
- the TCP listener requires a token (`access.TokenFile`: a 0600 file beside the socket), sent as the
  first message; without it nothing else is answered;
- frames are bounded (`ConnectionLimits.max_message`, refused unread), idle connections are closed
  after `idle_timeout` seconds, and at most `max_connections` are served at once (more are told
  "busy" and closed; readers then fetch directly);
- a TCP connection that has not yet given the token holds one of `max_unauthenticated` slots of its
  own (and is closed after `auth_timeout` seconds), never one of the owner's `max_connections`: any
  local user can open TCP connections, but cannot lock the owner's readers out;
- the socket's folder is created 0700 (or must be ours, or sticky like /tmp), the socket and the
  token file are checked to be ours (`vlmdata.fsutil`), and a socket another user left at
  the path is refused, not removed;
- `get` reads at most the declared size (or the budget), and when pinned entries fill the budget it
  answers "no_room" and the reader reads that shard directly: pressure costs speed, never samples.
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
from vlmdata.cache.daemon.access import DatasetAccess, TokenFile
from vlmdata.cache.daemon.budget import ReaderWindows, human_bytes, largest_shard_bytes
from vlmdata.cache.daemon.protocol import MAX_MESSAGE, recv_msg, ref_from_wire, send_msg
from vlmdata.cache.keys import key_for
from vlmdata.cache.shard_cache import ShardCache
from vlmdata.errors import BadKeyError, FetchError, NoRoomError, NotServedError, ProtocolError
from vlmdata.fsutil import check_private_file, private_parent
from vlmdata.metrics.registry import MetricSet
from vlmdata.retry import RetryPolicy

log = logging.getLogger(__name__)


@dataclass
class ConnectionLimits:
    """Bounds on what one client can make the daemon hold."""

    max_connections: int = 512          # readers served at once (local ranks x DataLoader workers, plus tools)
    idle_timeout: float = 600.0         # seconds a connection may stay silent (readers reconnect transparently)
    max_message: int = MAX_MESSAGE      # bytes in one frame (a plan of ~300k shards)
    max_unauthenticated: int = 16       # TCP connections still to give the token (a budget of their own)
    auth_timeout: float = 10.0          # seconds a TCP connection has to give the token

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.idle_timeout <= 0 or self.max_message < 1024 \
                or self.max_unauthenticated < 1 or self.auth_timeout <= 0:
            raise ValueError("max_connections and max_unauthenticated must be >= 1, idle_timeout and "
                             "auth_timeout > 0, max_message >= 1024")


@dataclass
class DaemonOptions:
    """What `vlmdata cache-daemon` is given.

    allow: dataset prefixes (folders or URL prefixes) the daemon serves; empty: the datasets its
        clients register over the Unix socket.
    token_file: where the TCP listener's token is written (default: `<socket>.token`, else
        `<cache_dir>/daemon.token`); clients pass it as `CacheConfig(daemon_token_file=...)`.
    windows: the readers the budget is sized for (reported at start and as a metric).
    """

    cache_dir: str
    disk_bytes: int
    socket_path: str | None = None
    tcp_port: int | None = None          # binds 127.0.0.1 only; 0 = any free port
    policy: str = "belady"
    prefetch_bytes: int = 4 << 30
    prefetch_threads: int = 8
    storage_options: dict = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    allow: list[str] = field(default_factory=list)
    token_file: str | None = None
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    windows: ReaderWindows = field(default_factory=ReaderWindows)


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
    check_private_file(path)                # another user's socket is theirs: refused, never removed
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
        self.access = DatasetAccess(opts.allow)
        cfg = CacheConfig(memory_bytes=0, disk_dir=opts.cache_dir, disk_bytes=opts.disk_bytes,
                          policy=opts.policy, prefetch_bytes=opts.prefetch_bytes,
                          prefetch_threads=opts.prefetch_threads, storage_options=opts.storage_options,
                          retry=opts.retry)
        self.cache = ShardCache(cfg, metrics=self.metrics)
        self.metrics.cache_budget.labels(tier="disk").set(opts.disk_bytes)
        self._servers: list[socketserver.BaseServer] = []
        self._threads: list[threading.Thread] = []
        self._ids = itertools.count()
        self._stopped = False
        self._lock = threading.Lock()
        self._connections = 0
        self._unauthenticated = 0
        self._largest_shard = 0
        self._budget_needed = 0
        self.token: TokenFile | None = None
        self.tcp_address: tuple[str, int] | None = None

    @property
    def budget_needed(self) -> int:
        """SSD bytes the readers' windows need (0 while no shard size is known); see budget.py."""
        return self._budget_needed

    @property
    def connections(self) -> int:
        """Readers served now (Unix socket, and TCP ones that gave the token)."""
        return self._connections

    @property
    def unauthenticated(self) -> int:
        """TCP connections open now that have not given the token yet."""
        return self._unauthenticated

    def start(self) -> None:
        handler = self._handler_class()
        if self.opts.socket_path:
            path = private_parent(self.opts.socket_path)
            _claim_socket_path(path)
            old = os.umask(0o177)  # the socket is created 0600: no window where others could connect
            try:
                server = _UnixServer(path, handler)
            finally:
                os.umask(old)
            os.chmod(path, 0o600)
            check_private_file(path)
            self._servers.append(server)
            log.info("cache daemon listening on unix socket %s", path)
        if self.opts.tcp_port is not None:
            self.token = TokenFile(self._token_path())
            server = _TCPServer(("127.0.0.1", int(self.opts.tcp_port)), handler)
            self.tcp_address = server.server_address
            self._servers.append(server)
            log.info("cache daemon listening on tcp://%s:%d (clients need the token in %s)", *self.tcp_address,
                     self.token.path)
        if self.access.fixed:
            log.info("serving the datasets under: %s", ", ".join(self.access.prefixes))
        else:
            log.info("serving the datasets readers register over the Unix socket")
        self._report_budget(largest_shard_bytes(self.access.prefixes, self.opts.storage_options) or 0, 0)
        for s in self._servers:
            t = threading.Thread(target=s.serve_forever, name="vlmdata-cache-daemon", daemon=True)
            t.start()
            self._threads.append(t)

    def _token_path(self) -> str:
        if self.opts.token_file:
            return self.opts.token_file
        if self.opts.socket_path:
            return os.path.abspath(self.opts.socket_path) + ".token"
        return os.path.join(self.opts.cache_dir, "daemon.token")

    def stop(self) -> None:
        """Stop accepting, close the sockets, remove the socket and token files, release the cache dir."""
        if self._stopped:
            return
        self._stopped = True
        for s in self._servers:
            s.shutdown()
            s.server_close()
        if self.opts.socket_path and os.path.lexists(self.opts.socket_path):
            os.unlink(self.opts.socket_path)
        if self.token is not None:
            self.token.remove()
        self.cache.close()
        log.info("cache daemon stopped: %s", self.cache.stats.to_dict())

    # -- the budget readers need ------------------------------------------------------------------
    def _report_budget(self, largest_shard: int, live_readers: int) -> None:
        """Update the largest shard seen; log and export what the windows need when it grows."""
        windows, budget = self.opts.windows, self.opts.disk_bytes
        with self._lock:
            self._largest_shard = max(self._largest_shard, int(largest_shard))
            need = windows.need(self._largest_shard, live_readers)
            grew = need > self._budget_needed
            self._budget_needed = max(self._budget_needed, need)
        self.metrics.cache_budget_needed.set(self._budget_needed)
        if not self._largest_shard:
            log.info("SSD budget %d bytes; the readers' windows need %d shards x the largest shard (not known "
                     "until a dataset is registered)", budget, windows.window_shards * windows.workers
                     * windows.local_ranks)
        elif grew:
            text = windows.describe(self._largest_shard, live_readers)
            if need > budget:
                log.warning("the readers' windows need %s, more than the %s SSD budget: shards will be "
                            "fetched again or read without caching (slower, no sample is lost); raise "
                            "--disk-bytes to at least %d", text, human_bytes(budget), need)
            else:
                log.info("the readers' windows need %s; the SSD budget is %s", text, human_bytes(budget))

    # -- one connection --------------------------------------------------------------------------
    def _handler_class(self):
        daemon = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                daemon._serve_connection(self.request)

        return Handler

    def _admit(self, pool: str) -> bool:
        """Take a slot of `pool` ("owner": Unix-socket and authenticated TCP readers; "unauthenticated":
        TCP connections yet to give the token)."""
        with self._lock:
            if pool == "owner":
                if self._connections >= self.opts.limits.max_connections:
                    return False
                self._connections += 1
            else:
                if self._unauthenticated >= self.opts.limits.max_unauthenticated:
                    return False
                self._unauthenticated += 1
            return True

    def _release(self, pool: str) -> None:
        with self._lock:
            if pool == "owner":
                self._connections -= 1
            else:
                self._unauthenticated -= 1

    def _busy(self, sock: socket.socket, pool: str) -> None:
        limit = self.opts.limits.max_connections if pool == "owner" else self.opts.limits.max_unauthenticated
        log.warning("refusing a connection: %d %s connections are open", limit,
                    "reader" if pool == "owner" else "unauthenticated TCP")
        try:
            sock.settimeout(5)
            send_msg(sock, {"ok": False, "error": "busy", "message": f"the cache daemon serves {limit} "
                            f"{'connections' if pool == 'owner' else 'connections without the token'} at most; "
                            "fetch directly"})
        except OSError:
            pass

    def _serve_connection(self, sock: socket.socket) -> None:
        over_tcp = sock.family != socket.AF_UNIX
        if over_tcp:
            if not self._admit("unauthenticated"):
                return self._busy(sock, "unauthenticated")
            try:
                sock.settimeout(self.opts.limits.auth_timeout)
                ok = self._authenticate(sock)
            except (ConnectionError, OSError) as exc:
                log.debug("unauthenticated connection closed: %s", exc)
                ok = False
            finally:
                self._release("unauthenticated")
            if not ok:
                return
        if not self._admit("owner"):
            return self._busy(sock, "owner")
        try:
            self._serve_reader(sock, over_tcp)
        finally:
            self._release("owner")

    def _serve_reader(self, sock: socket.socket, over_tcp: bool) -> None:
        limits = self.opts.limits
        reader = next(self._ids)
        pinned: str | None = None
        try:
            sock.settimeout(limits.idle_timeout)  # a silent connection is closed (the reader reconnects)
            while True:
                try:
                    msg = recv_msg(sock, limits.max_message)
                except ProtocolError as exc:
                    send_msg(sock, {"ok": False, "error": "bad_request", "message": str(exc)})
                    return
                if msg is None:
                    return
                if pinned is not None:  # the reader has mapped the last file by now
                    self.cache.unpin(pinned)
                    pinned = None
                reply, pinned = self._answer(reader, msg, over_tcp)
                send_msg(sock, reply)
        except (ConnectionError, OSError) as exc:  # closed, reset, or idle past the timeout
            log.debug("reader %d disconnected: %s", reader, exc)
        finally:
            if pinned is not None:
                self.cache.unpin(pinned)
            self.cache.drop_reader(reader)

    def _authenticate(self, sock: socket.socket) -> bool:
        """The first TCP message must be {"op": "hello", "token": T} with this daemon's token."""
        try:
            msg = recv_msg(sock, 4096)
        except ProtocolError:
            msg = {}
        if msg is None:
            return False
        if msg.get("op") == "hello" and self.token is not None and self.token.matches(msg.get("token")):
            send_msg(sock, {"ok": True})
            return True
        send_msg(sock, {"ok": False, "error": "auth", "message": "TCP clients must first send the daemon's token "
                        "(CacheConfig(daemon_token_file=...); the daemon logs the token file's path)"})
        return False

    def _answer(self, reader: int, msg: dict, over_tcp: bool) -> tuple[dict, str | None]:
        op = msg.get("op")
        try:
            if op == "get":
                ref = ref_from_wire(msg.get("ref"))
                key = key_for(ref)                    # string checks only
                self.access.check(ref.url)            # before anything touches the path or URL
                path, size = self.cache.get_path(ref, reader)
                return {"ok": True, "path": path, "size": size}, key
            if op == "plan":
                refs = msg.get("refs")
                if not isinstance(refs, list):
                    raise ProtocolError("plan.refs must be a list")
                refs = [ref_from_wire(r) for r in refs]
                for r in refs:
                    self.access.check(r.url)
                self.cache.plan(reader, refs)
                sizes = [r.size for r in refs if r.size is not None]
                if sizes:
                    self._report_budget(max(sizes), len(self.cache.plans.plans))
                return {"ok": True}, None
            if op == "register":
                if over_tcp:
                    raise NotServedError("datasets are registered over the daemon's Unix socket only")
                added = self.access.register(msg.get("prefixes"))
                if added:
                    log.info("serving %s (registered by reader %d)", ", ".join(added), reader)
                return {"ok": True}, None
            if op == "stats":
                return {"ok": True, "stats": self.cache.stats.to_dict()}, None
            if op in ("ping", "hello"):
                return {"ok": True}, None
            raise ProtocolError(f"unknown op {op!r}")
        except BadKeyError as exc:
            return {"ok": False, "error": "bad_key", "message": str(exc)}, None
        except NotServedError as exc:
            return {"ok": False, "error": "forbidden", "message": str(exc)}, None
        except NoRoomError as exc:
            return {"ok": False, "error": "no_room", "message": str(exc)}, None
        except (ProtocolError, ValueError) as exc:
            return {"ok": False, "error": "bad_request", "message": str(exc)}, None
        except FetchError as exc:
            return {"ok": False, "error": "fetch", "message": str(exc)}, None
