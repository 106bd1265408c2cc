"""The future access sequence(s) a cache knows about, and the eviction policies that use them.

`AccessPlan` is one reader's future: the keys it will get, in order, repeats included, plus a
position that advances as gets arrive. `PlanBook` holds the plans of several readers (the node
daemon merges every local reader's plan); the distance to a key's next use is the minimum over
readers. `choose_victims` implements Belady (evict what is next needed farthest in the future)
and LRU; keys the plans do not mention fall back to LRU order.
"""
from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Hashable, Iterable, Iterator

from vlmdata.cache.keys import key_for
from vlmdata.errors import BadKeyError

log = logging.getLogger(__name__)

INF = math.inf


class AccessPlan:
    """One reader's future accesses; `consume(key)` advances the position on each get.

    A get for a key that appears within `slack` positions of the current position consumes that
    occurrence (readers may deviate slightly, e.g. skip a failed shard); any other get is
    unplanned and leaves the position alone.
    """

    def __init__(self, keys: list[str], slack: int = 32):
        self.keys = list(keys)
        self.pos = 0
        self.slack = slack
        self._occ: dict[str, deque[int]] = {}
        self._last: dict[str, int] = {}  # key -> position of its last consumed access
        for i, k in enumerate(self.keys):
            self._occ.setdefault(k, deque()).append(i)

    def __len__(self) -> int:
        return len(self.keys)

    def mentions(self, key: str) -> bool:
        return key in self._occ

    def next_use(self, key: str) -> float:
        """Positions from now until `key` is next needed (0 = next); INF if never again."""
        dq = self._occ.get(key)
        if not dq:
            return INF
        while dq and dq[0] < self.pos:
            dq.popleft()
        return dq[0] - self.pos if dq else INF

    def consume(self, key: str) -> bool:
        """Record a get of `key`; True if it was the planned access (position advanced).

        The planned next access advances by one. A re-read of a key consumed within the last
        `slack` positions is a repeat, not a jump to its next planned use.
        """
        d = self.next_use(key)
        if d > self.slack or (d > 0 and self._last.get(key, -self.slack - 1) >= self.pos - self.slack):
            return False
        idx = self._occ[key].popleft()
        self._last[key] = idx
        self.pos = idx + 1
        return True

    def remaining(self) -> list[str]:
        return self.keys[self.pos:]

    def upcoming(self) -> Iterator[str]:
        for i in range(self.pos, len(self.keys)):
            yield self.keys[i]


class PlanBook:
    """Plans of several readers, keyed by reader id."""

    def __init__(self, slack: int = 32):
        self.slack = slack
        self.plans: dict[Hashable, AccessPlan] = {}

    def set(self, reader: Hashable, keys: list[str]) -> None:
        """Replace `reader`'s future with `keys` (an empty list forgets it)."""
        if keys:
            self.plans[reader] = AccessPlan(keys, self.slack)
        else:
            self.plans.pop(reader, None)

    def drop(self, reader: Hashable) -> None:
        self.plans.pop(reader, None)

    def consume(self, reader: Hashable, key: str) -> bool:
        plan = self.plans.get(reader)
        return plan.consume(key) if plan is not None else False

    def next_use(self, key: str) -> float:
        return min((p.next_use(key) for p in self.plans.values()), default=INF)

    def mentions(self, key: str) -> bool:
        return any(p.mentions(key) for p in self.plans.values())

    def upcoming(self) -> Iterator[tuple[int, str]]:
        """(distance, key) over all readers' futures, nearest first (readers interleaved)."""
        iters = [p.upcoming() for p in self.plans.values()]
        d = 0
        while iters:
            alive = []
            for it in iters:
                k = next(it, None)
                if k is not None:
                    alive.append(it)
                    yield d, k
            iters = alive
            d += 1


def choose_victims(candidates: Iterable[str], sizes: dict[str, int], need: int, policy: str,
                   plans: PlanBook | None) -> list[str]:
    """Keys to evict, in order, until at least `need` bytes are freed (or candidates run out).

    `candidates` must be in LRU order (least recently used first). Belady evicts the key whose
    next use is farthest away; keys no plan will use again go first, oldest first (LRU).
    """
    if need <= 0:
        return []
    cands = list(candidates)
    if policy == "belady" and plans is not None and plans.plans:
        rank = {k: i for i, k in enumerate(cands)}
        cands.sort(key=lambda k: (-plans.next_use(k), rank[k]))
    elif policy not in ("belady", "lru"):
        raise ValueError(f"unknown cache policy {policy!r}: use 'belady' or 'lru'")
    out, freed = [], 0
    for k in cands:
        if freed >= need:
            break
        out.append(k)
        freed += sizes[k]
    return out


def planned_keys(refs: list) -> tuple[list, list[str]]:
    """(refs, keys) without the refs whose key is invalid (their gets will raise BadKeyError)."""
    out_refs, keys, bad = [], [], 0
    for r in refs:
        try:
            keys.append(key_for(r))
        except BadKeyError as exc:
            bad += 1
            if bad == 1:
                log.warning("plan: ignoring shard(s) with an invalid cache key, e.g. %s", exc)
            continue
        out_refs.append(r)
    return out_refs, keys
