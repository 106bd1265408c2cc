"""Reader side of the cache daemon, with fallback to direct tiered fetching.

`DaemonClient` is the ShardFetcher a DataLoader worker gets from `CacheConfig(daemon=...).open()`.
Each get asks the daemon for the shard's file and mmaps it (no bytes through the socket). If the
daemon is absent, or dies mid-epoch, the client switches to an in-process ShardCache (memory tier
+ prefetch, same plan, same verification) and the epoch continues with nothing lost; every
`reconnect_seconds` it tries the daemon again and hands it the rest of the plan.

Over the Unix socket the client registers the folders of the shards it plans (the daemon serves only
registered or `--allow`ed datasets); over TCP it first sends the daemon's token (read from
`CacheConfig.daemon_token_file`). A shard the daemon will not cache now ("no_room": its budget is held
by pinned entries) or does not serve ("forbidden") is read directly for that one get ("read through"),
without leaving the daemon. A connection the daemon closed while idle is reopened at once.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time

from vlmdata.cache.daemon.access import dataset_prefix, read_token
from vlmdata.cache.daemon.protocol import connect, parse_address, recv_msg, ref_to_wire, send_msg
from vlmdata.cache.eviction import AccessPlan, planned_keys
from vlmdata.cache.fetch import DirectFetcher, ShardRef
from vlmdata.cache.keys import key_for
from vlmdata.cache.tiers import map_file
from vlmdata.errors import BadKeyError, FetchError, ProtocolError, UnsafePathError
from vlmdata.fsutil import check_private_file
from vlmdata.metrics.counts import StatsDelta

log = logging.getLogger(__name__)


MAX_PLAN_REFS = 100_000   # ~15 MB on the wire, well inside the daemon's frame limit; the near future is what counts


def _plan_msg(refs: list[ShardRef]) -> dict:
    """A plan message with the next MAX_PLAN_REFS reads (a longer plan is sent again as it is consumed)."""
    return {"op": "plan", "refs": [ref_to_wire(r) for r in refs[:MAX_PLAN_REFS]]}


class _ReadThrough(Exception):
    """The daemon answered but will not serve this get from its cache: read the shard directly."""


class DaemonClient:
    """ShardFetcher talking to the node's cache daemon; falls back to fetching directly."""

    reconnect_seconds = 10.0
    timeout_seconds = 600.0  # at least: a get may wait for a slow remote fetch (with its retries)

    def __init__(self, config):
        self.config = config
        self.timeout_seconds = max(self.timeout_seconds, config.retry.deadline + 300.0)
        self._lock = threading.Lock()
        self._sock = None
        self._registered: set[str] = set()
        self._warned: set[str] = set()
        self._direct = DirectFetcher(config.storage_options, config.retry)   # read-through gets
        self._read_through_delta = StatsDelta()
        self.read_through_gets = 0
        self._refs: list[ShardRef] = []
        self._plan = AccessPlan([])
        self._fallback = None
        self._retired = None          # counts of a fallback cache closed since the last take_stats
        self._last_failure: float | None = None
        self.daemon_gets = 0
        self.fallback_gets = 0
        self.disconnects = 0

    # -- ShardFetcher -----------------------------------------------------------------------------
    def plan_ahead(self, refs: list[ShardRef]) -> None:
        """Replace the future access sequence; forwarded to the daemon (or the fallback)."""
        with self._lock:
            self._refs, keys = planned_keys(list(refs))
            self._plan = AccessPlan(keys)
            if self._connected_or_retry():
                try:
                    self._register(self._refs)
                    reply = self._rpc(_plan_msg(self._refs))
                    if reply.get("ok"):
                        return
                    self._warn_once("plan", "cache daemon refused the plan (%s: %s); those shards are read "
                                    "directly", reply.get("error"), reply.get("message"))
                except (OSError, ProtocolError) as exc:
                    self._lost(exc)
            self._fallback_cache().plan(0, self._refs)

    def get(self, ref: ShardRef):
        key = key_for(ref)  # rejects bad keys before anything else
        with self._lock:
            self._plan.consume(key)
            if self._connected_or_retry():
                try:
                    return self._get_via_daemon(ref)
                except FetchError:
                    raise  # the daemon answered: the store failed after its retries (FetchError is an OSError)
                except _ReadThrough:
                    cache = None
                except (OSError, ProtocolError) as exc:
                    self._lost(exc)
                    cache = self._fallback_cache()
            else:
                cache = self._fallback_cache()
        if cache is None:  # the daemon is there but will not cache this one: one direct read, no caching
            data = self._direct.get(ref)
            with self._lock:
                self.read_through_gets += 1
                self._read_through_delta.record_fetch("remote", True, len(data))
            return data
        self.fallback_gets += 1
        return cache.get(ref, 0)

    def stats(self) -> dict:
        out = {"daemon_gets": self.daemon_gets, "fallback_gets": self.fallback_gets,
               "read_through_gets": self.read_through_gets, "disconnects": self.disconnects}
        if self._fallback is not None:
            out["fallback"] = self._fallback.stats.to_dict()
        return out

    def take_stats(self):
        """Counts of the in-process fallback cache since the last call (a StatsDelta), or None.
        Gets served by the daemon are counted by the daemon's own metrics."""
        with self._lock:
            out, self._retired = self._retired, None
            if self.read_through_gets:
                got, self._read_through_delta = self._read_through_delta, StatsDelta()
                out = got if out is None else out.merge(got)
            if self._fallback is not None:
                got = self._fallback.stats.take()
                out = got if out is None else out.merge(got)
        return out

    def close(self) -> None:
        with self._lock:
            self._disconnect()
            if self._fallback is not None:
                self._fallback.close()
                self._fallback = None

    # -- internals --------------------------------------------------------------------------------
    def _get_via_daemon(self, ref: ShardRef):
        self._register([ref])
        reply = self._rpc({"op": "get", "ref": ref_to_wire(ref)})
        if not reply.get("ok"):
            err, message = reply.get("error"), reply.get("message", "")
            if err == "fetch":
                raise FetchError(message)
            if err == "bad_key":
                raise BadKeyError(message)
            if err in ("no_room", "forbidden"):
                self._warn_once(err, "cache daemon did not serve %s (%s: %s); reading it directly",
                                ref.url, err, message)
                raise _ReadThrough(message)
            raise ProtocolError(f"daemon refused the request: {err}: {message}")
        data = map_file(str(reply["path"]))
        if ref.size is not None and len(data) != ref.size:
            raise ProtocolError(f"daemon file for {ref.url} has {len(data)} bytes, expected {ref.size}")
        self.daemon_gets += 1
        return data

    def _rpc(self, msg: dict) -> dict:
        """One request and its reply; a connection the daemon closed (idle timeout) is reopened once."""
        try:
            return self._rpc_once(msg)
        except (ConnectionError, TimeoutError) as exc:
            if isinstance(exc, TimeoutError) or self._sock is None:
                raise
            log.debug("cache daemon connection closed (%s); reconnecting", exc)
            self._disconnect()
            self._open()
            rest = self._refs[self._plan.pos:]
            if rest and msg.get("op") != "plan":      # the daemon forgot this reader's plan with the connection
                self._rpc_once(_plan_msg(rest))
            return self._rpc_once(msg)

    def _rpc_once(self, msg: dict) -> dict:
        send_msg(self._sock, msg)
        reply = recv_msg(self._sock)
        if reply is None:
            raise ConnectionError("cache daemon closed the connection")
        return reply

    def _open(self) -> None:
        """Connect, authenticate (TCP) and register what is known (Unix socket); raises on failure."""
        if not self._over_tcp:                       # a socket another user put there is not our daemon
            try:
                check_private_file(parse_address(self.config.daemon)[1])
            except UnsafePathError as exc:
                raise ProtocolError(str(exc)) from None
        self._sock = connect(self.config.daemon, timeout=self.timeout_seconds)
        known, self._registered = self._registered, set()
        if self._over_tcp:
            reply = self._rpc_once({"op": "hello", "token": self._token()})
        elif known:                                  # a new daemon (or connection): register again
            reply = self._rpc_once({"op": "register", "prefixes": sorted(known)})
            self._registered = known if reply.get("ok") else set()
        else:
            reply = self._rpc_once({"op": "ping"})
        if not reply.get("ok") and reply.get("error") in ("auth", "busy"):
            raise ProtocolError(f"cache daemon refused the connection: {reply.get('error')}: {reply.get('message')}")

    @property
    def _over_tcp(self) -> bool:
        return str(self.config.daemon).startswith("tcp://")

    def _token(self) -> str | None:
        path = getattr(self.config, "daemon_token_file", None)
        if not path:
            return None
        try:
            return read_token(path)
        except (OSError, UnsafePathError) as exc:
            raise ProtocolError(f"cannot read the daemon's token file {path}: {exc}") from None

    def _register(self, refs: list[ShardRef]) -> None:
        """Over the Unix socket: ask the daemon to serve the folders these shards live in."""
        if self._over_tcp:
            return
        prefixes = sorted({dataset_prefix(r.url) for r in refs} - self._registered)
        if not prefixes:
            return
        reply = self._rpc({"op": "register", "prefixes": prefixes})
        if reply.get("ok"):
            self._registered.update(prefixes)
        else:
            self._warn_once("register", "cache daemon does not serve %s (%s); their shards are read directly",
                            ", ".join(prefixes), reply.get("message"))

    def _warn_once(self, what: str, fmt: str, *args) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(fmt, *args)

    def _connected_or_retry(self) -> bool:
        """True with a live connection; reconnects (and resends the plan) when it is time to."""
        if self._sock is not None:
            return True
        now = time.monotonic()
        if self._last_failure is not None and now < self._last_failure + self.reconnect_seconds:
            return False
        self._last_failure = now
        try:
            self._open()
            rest = self._refs[self._plan.pos:]
            if rest:
                self._register(rest)
                self._rpc(_plan_msg(rest))
        except (OSError, ProtocolError) as exc:
            if self._fallback is None:
                log.warning("cache daemon at %s unavailable (%s); fetching directly", self.config.daemon, exc)
            self._disconnect()
            return False
        self._last_failure = None
        if self._fallback is not None:
            log.info("cache daemon at %s is back; using it again", self.config.daemon)
            self._fallback.close()
            got = self._fallback.stats.take()             # reported by the next take_stats
            self._retired = got if self._retired is None else self._retired.merge(got)
            self._fallback = None
        return True

    def _lost(self, exc: Exception) -> None:
        log.warning("lost the cache daemon at %s (%s); fetching directly", self.config.daemon, exc)
        self.disconnects += 1
        self._disconnect()
        self._last_failure = time.monotonic()

    def _disconnect(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def _fallback_cache(self):
        if self._fallback is None:
            from vlmdata.cache.shard_cache import ShardCache

            cfg = dataclasses.replace(self.config, daemon=None, disk_dir=None, disk_bytes=0)
            self._fallback = ShardCache(cfg)
            rest = self._refs[self._plan.pos:]
            if rest:
                self._fallback.plan(0, rest)
            log.info("direct fetching in pid %d (memory tier %d bytes)", os.getpid(), cfg.memory_bytes)
        return self._fallback
