"""Reader side of the cache daemon, with fallback to direct tiered fetching.

`DaemonClient` is the ShardFetcher a DataLoader worker gets from `CacheConfig(daemon=...).open()`.
Each get asks the daemon for the shard's file and mmaps it (no bytes through the socket). If the
daemon is absent, or dies mid-epoch, the client switches to an in-process ShardCache (memory tier
+ prefetch, same plan, same verification) and the epoch continues with nothing lost; every
`reconnect_seconds` it tries the daemon again and hands it the rest of the plan.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time

from vlmdata.cache.daemon.protocol import connect, recv_msg, ref_to_wire, send_msg
from vlmdata.cache.eviction import AccessPlan, planned_keys
from vlmdata.cache.fetch import ShardRef
from vlmdata.cache.keys import key_for
from vlmdata.cache.tiers import map_file
from vlmdata.errors import BadKeyError, FetchError, ProtocolError

log = logging.getLogger(__name__)


class DaemonClient:
    """ShardFetcher talking to the node's cache daemon; falls back to fetching directly."""

    reconnect_seconds = 10.0
    timeout_seconds = 600.0  # a get may wait for a slow remote fetch (with its retries)

    def __init__(self, config):
        self.config = config
        self._lock = threading.Lock()
        self._sock = None
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
                    reply = self._rpc({"op": "plan", "refs": [ref_to_wire(r) for r in self._refs]})
                    if not reply.get("ok"):
                        log.warning("cache daemon refused the plan: %s", reply.get("message"))
                    return
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
                except (OSError, ProtocolError) as exc:
                    self._lost(exc)
            cache = self._fallback_cache()
        self.fallback_gets += 1
        return cache.get(ref, 0)

    def stats(self) -> dict:
        out = {"daemon_gets": self.daemon_gets, "fallback_gets": self.fallback_gets,
               "disconnects": self.disconnects}
        if self._fallback is not None:
            out["fallback"] = self._fallback.stats.to_dict()
        return out

    def take_stats(self):
        """Counts of the in-process fallback cache since the last call (a StatsDelta), or None.
        Gets served by the daemon are counted by the daemon's own metrics."""
        with self._lock:
            out, self._retired = self._retired, None
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
        reply = self._rpc({"op": "get", "ref": ref_to_wire(ref)})
        if not reply.get("ok"):
            err, message = reply.get("error"), reply.get("message", "")
            if err == "fetch":
                raise FetchError(message)
            if err == "bad_key":
                raise BadKeyError(message)
            raise ProtocolError(f"daemon refused the request: {err}: {message}")
        data = map_file(str(reply["path"]))
        if ref.size is not None and len(data) != ref.size:
            raise ProtocolError(f"daemon file for {ref.url} has {len(data)} bytes, expected {ref.size}")
        self.daemon_gets += 1
        return data

    def _rpc(self, msg: dict) -> dict:
        send_msg(self._sock, msg)
        reply = recv_msg(self._sock)
        if reply is None:
            raise ConnectionError("cache daemon closed the connection")
        return reply

    def _connected_or_retry(self) -> bool:
        """True with a live connection; reconnects (and resends the plan) when it is time to."""
        if self._sock is not None:
            return True
        now = time.monotonic()
        if self._last_failure is not None and now < self._last_failure + self.reconnect_seconds:
            return False
        self._last_failure = now
        try:
            self._sock = connect(self.config.daemon, timeout=self.timeout_seconds)
            rest = self._refs[self._plan.pos:]
            if rest:
                self._rpc({"op": "plan", "refs": [ref_to_wire(r) for r in rest]})
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
