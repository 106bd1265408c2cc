"""Sequence packing under a token budget and an image budget.

`pack` is the planner's packer, a histogram-based greedy with a subset-sum
completion of each pack:

* Lengths are small integers, so the samples left are kept as a histogram: a
  sorted list of the distinct lengths still available plus a queue of samples
  per length. "The longest length that fits" is one `bisect`: O(n log d) for
  d distinct lengths, in one tight loop (no per-pack scan as in best-fit).
* Each pack is opened with the longest sample left. It is then filled not with
  the longest sample that fits, but, with m = ceil(room / longest fitting
  length) samples still needed, with the shortest length >= room / m: early in
  a pack that is about the longest; near the end it steers the last samples to
  fill the room exactly instead of leaving a gap shorter than any sample left
  (best-fit-decreasing's main loss: it fills with long samples first and is
  left with packs of short ones that cannot close their last gap).
* If a gap of more than `REPAIR_MIN` x max_tokens remains, the pack's last
  sample is put back and the freed room is re-filled with the best single
  sample or pair of samples (a bounded subset-sum search over the histogram:
  pairs a >= b, b found by bisect); if a gap still remains, the last two are
  put back and the best triple is searched the same way. When the samples
  left cannot do better (REPAIR_GIVE_UP fruitless tries in a row, typically
  the last packs of a window) the search stops for the window.

At 8192 tokens this fills 99.3 % of the packs on the 2000-sample gen_raw.py
corpus and 99.7 % on 200k samples of its distribution, where
best-fit-decreasing reaches 98.3 % / 98.75 % (tools/bench_packing.py).
`next_fit` and `best_fit_decreasing` are the reference baselines (benchmarks, tests).
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

import numpy as np

REPAIR_TRIES = 12         # first lengths tried by the pair search
REPAIR_TRIES_DEEP = 6     # first lengths tried by the triple search (each runs a pair search)
REPAIR_MIN = 0.002        # fraction of max_tokens: smaller gaps are left alone
REPAIR_GIVE_UP = 64       # stop repairing a window's packs after this many fruitless tries in a row


class _Pool:
    """Available samples as a histogram: sorted distinct lengths + a queue per length.

    Samples are sorted by (length, images); the queue of length v is the slice
    [head[v], end[v]) of that order, so a sample is named by its position in it.
    """

    def __init__(self, lengths: np.ndarray, images: np.ndarray, max_tokens: int):
        order = np.lexsort((images, lengths))          # by length, fewer images first
        self.order = order
        sorted_len = lengths[order]
        self.images = images[order].tolist()           # images of the sample at each position
        self.lengths = sorted_len.tolist()
        values, starts, counts = np.unique(sorted_len, return_index=True, return_counts=True)
        self.head = [0] * (max_tokens + 1)
        self.end = [0] * (max_tokens + 1)
        for v, h, c in zip(values.tolist(), starts.tolist(), counts.tolist()):
            self.head[v] = h
            self.end[v] = h + c
        self.values = values.tolist()                  # sorted distinct lengths with samples left

    def fits(self, room: int) -> int:
        """Position in `values` of the longest length <= room, or -1."""
        return bisect_right(self.values, room) - 1

    def take(self, value: int) -> int:
        """Take the next sample of length `value`; returns its position."""
        h = self.head[value]
        self.head[value] = h + 1
        if h + 1 == self.end[value]:
            del self.values[bisect_left(self.values, value)]
        return h

    def put_back(self, value: int) -> None:
        """Undo the latest `take(value)` (LIFO per length)."""
        h = self.head[value] - 1
        if h + 1 == self.end[value]:
            insort(self.values, value)
        self.head[value] = h


def _fill(pool: _Pool, room: int, img_room: int, taken: list[int]) -> tuple[int, int]:
    """Greedy completion of a pack (appends positions to `taken`); returns (room, img_room) left."""
    values, head, end, images = pool.values, pool.head, pool.end, pool.images
    while room > 0 and values:
        pos = bisect_right(values, room) - 1
        if pos < 0:
            break
        longest = values[pos]
        if longest < room:
            m = -(-room // longest)
            alt = bisect_left(values, -(-room // m))
            if alt < pos:
                pos = alt
        v = values[pos]
        h = head[v]
        if images[h] > img_room:                       # rare: look for shorter samples with fewer images
            tries = 0
            while pos > 0 and tries < 32:
                pos -= 1
                tries += 1
                if images[head[values[pos]]] <= img_room:
                    break
            v = values[pos]
            h = head[v]
            if images[h] > img_room:
                break
        head[v] = h + 1
        if h + 1 == end[v]:
            del values[pos]
        taken.append(h)
        room -= v
        img_room -= images[h]
    return room, img_room


def _best_pair(pool: _Pool, room: int, img_room: int) -> tuple[int, int, int]:
    """Best fill of `room` by one or two available samples: (fill, a, b), b = 0 for a single.

    Enumerates a over the REPAIR_TRIES longest lengths that fit, with b the
    longest length <= min(a, room - a) (one bisect each), reading the queues
    directly, so the search touches no sample it does not return.
    """
    values, head, end, images = pool.values, pool.head, pool.end, pool.images
    best = (0, 0, 0)
    pos = bisect_right(values, room) - 1
    tried = 0
    while pos >= 0 and tried < REPAIR_TRIES:
        a = values[pos]
        if 2 * a <= best[0]:                    # pairs of lengths <= a cannot beat the best
            break
        ha = head[a]
        img_a = images[ha]
        if img_a <= img_room:
            if a > best[0]:
                best = (a, a, 0)
            rest = min(room - a, a)
            q = bisect_right(values, rest) - 1
            if q >= 0:
                b = values[q]
                if b == a and end[a] - ha < 2:   # a single sample of length a: take the next length
                    q -= 1
                    b = values[q] if q >= 0 else 0
                if b:
                    img_b = images[ha + 1] if b == a else images[head[b]]
                    if a + b > best[0] and img_a + img_b <= img_room:
                        best = (a + b, a, b)
            if best[0] == room:
                break
        pos -= 1
        tried += 1
    return best


def _repair(pool: _Pool, taken: list[int], room: int, img_room: int) -> tuple[list[int], int, int]:
    """Subset-sum completion: put the pack's last sample back and re-fill the freed room with
    the best single sample or pair of samples, when that fills more."""
    if len(taken) < 2:
        return taken, room, img_room
    last = taken[-1]
    v = pool.lengths[last]
    pool.put_back(v)
    freed, freed_img = room + v, img_room + pool.images[last]
    fill, a, b = _best_pair(pool, freed, freed_img)
    if fill > v:
        new = [pool.take(a)] + ([pool.take(b)] if b else [])
        return taken[:-1] + new, freed - fill, freed_img - sum(pool.images[h] for h in new)
    pool.take(v)
    return taken, room, img_room


def _repair_two(pool: _Pool, taken: list[int], room: int, img_room: int) -> tuple[list[int], int, int]:
    """Deeper completion: put the last two samples back and re-fill with the best of up to three."""
    if len(taken) < 3:
        return taken, room, img_room
    lengths, images = pool.lengths, pool.images
    tail = taken[-2:]
    old = lengths[tail[0]] + lengths[tail[1]]
    for h in reversed(tail):
        pool.put_back(lengths[h])
    freed, freed_img = room + old, img_room + images[tail[0]] + images[tail[1]]
    best = (old, [])
    pos = bisect_right(pool.values, freed) - 1
    tried = 0
    while pos >= 0 and tried < REPAIR_TRIES_DEEP:
        a = pool.values[pos]
        if 3 * a <= best[0]:
            break
        h = pool.take(a)
        if images[h] <= freed_img:
            fill, b, c = _best_pair(pool, freed - a, freed_img - images[h])
            if a + fill > best[0]:
                best = (a + fill, [v for v in (a, b, c) if v])
        pool.put_back(a)
        if best[0] == freed:
            break
        pos = bisect_right(pool.values, a) - 2          # the next shorter length
        tried += 1
    if best[1]:
        new = [pool.take(v) for v in best[1]]
        new_img = sum(images[h] for h in new)
        if new_img <= freed_img:
            return taken[:-2] + new, freed - best[0], freed_img - new_img
        for h in reversed(new):
            pool.put_back(lengths[h])
    for h in tail:
        pool.take(lengths[h])
    return taken, room, img_room


def pack(lengths: np.ndarray, images: np.ndarray, max_tokens: int, max_images: int,
         repair: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Pack samples (lengths <= max_tokens, images <= max_images) into bins.

    Returns (order, bounds): pack p holds positions order[bounds[p]:bounds[p+1]]
    of the input arrays. Deterministic for equal inputs.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    images = np.asarray(images, dtype=np.int64)
    if len(lengths) and (lengths.max() > max_tokens or images.max() > max_images or lengths.min() < 0):
        raise ValueError("pack() needs samples within the budgets; truncate or drop them first")
    pool = _Pool(lengths, images, max_tokens)
    values, head, end, imgs = pool.values, pool.head, pool.end, pool.images
    min_gap = max(1, int(max_tokens * REPAIR_MIN))
    failures = 0                                # consecutive repairs that found nothing better
    out: list[int] = []
    bounds = [0]
    while values:
        v = values[-1]                          # open with the longest sample left
        h = head[v]
        head[v] = h + 1
        if h + 1 == end[v]:
            values.pop()
        taken = [h]
        room, img_room = _fill(pool, max_tokens - v, max_images - imgs[h], taken)
        if repair and room >= min_gap and values and failures < REPAIR_GIVE_UP:
            before = room
            taken, room, img_room = _repair(pool, taken, room, img_room)
            if room >= min_gap:
                taken, room, img_room = _repair_two(pool, taken, room, img_room)
            failures = 0 if room < before else failures + 1
        out.extend(taken)
        bounds.append(len(out))
    return pool.order[np.asarray(out, dtype=np.int64)] if out else np.zeros(0, np.int64), \
        np.asarray(bounds, dtype=np.int64)


def next_fit(lengths: np.ndarray, images: np.ndarray, max_tokens: int, max_images: int) -> tuple[np.ndarray, np.ndarray]:
    """Streaming baseline: append samples in order, start a new pack when one does not fit."""
    bounds = [0]
    room, img_room = max_tokens, max_images
    for i, (n, k) in enumerate(zip(np.asarray(lengths).tolist(), np.asarray(images).tolist())):
        if n > room or k > img_room:
            bounds.append(i)
            room, img_room = max_tokens, max_images
        room -= n
        img_room -= k
    if len(lengths):
        bounds.append(len(lengths))
    return np.arange(len(lengths), dtype=np.int64), np.asarray(bounds, dtype=np.int64)


def best_fit_decreasing(lengths: np.ndarray, images: np.ndarray, max_tokens: int,
                        max_images: int) -> tuple[np.ndarray, np.ndarray]:
    """Baseline: longest first, each into the open pack with the least room that fits."""
    lengths = np.asarray(lengths, dtype=np.int64)
    images = np.asarray(images, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable").tolist()
    rooms: list[tuple[int, int]] = []      # sorted (room, pack id)
    packs: list[list[int]] = []
    img_left: list[int] = []
    for i in order:
        n, k = int(lengths[i]), int(images[i])
        pos = bisect_right(rooms, (n, -1))
        while pos < len(rooms) and img_left[rooms[pos][1]] < k:
            pos += 1
        if pos < len(rooms):
            room, p = rooms.pop(pos)
            insort(rooms, (room - n, p))
        else:
            p = len(packs)
            packs.append([])
            img_left.append(max_images)
            insort(rooms, (max_tokens - n, p))
        packs[p].append(i)
        img_left[p] -= k
    out = [i for p in packs for i in p]
    bounds = np.concatenate([[0], np.cumsum([len(p) for p in packs])]).astype(np.int64)
    return np.asarray(out, dtype=np.int64), bounds


def fill_ratio(lengths: np.ndarray, bounds: np.ndarray, max_tokens: int) -> float:
    """Real tokens / (packs * max_tokens)."""
    n_packs = len(bounds) - 1
    return float(np.asarray(lengths).sum()) / (n_packs * max_tokens) if n_packs else 1.0
