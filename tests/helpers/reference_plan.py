"""The epoch planner as it was before issue 15 (columns whole in memory, every window planned in order),
kept verbatim as the reference the bounded-memory planner must equal: same packs, same order, same drops,
same resume cursors. Tests only; `vlmdata.plan` is the implementation.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

import vlmdata.plan.shuffle as shuffle
from vlmdata.errors import Skip
from vlmdata.plan import PlanOptions, bucket, pack, sample_lengths, split_tail

MIX_SAMPLES, PACK_ORDER, WINDOW_SAMPLES = shuffle.MIX_SAMPLES, shuffle.PACK_ORDER, shuffle.WINDOW_SAMPLES
make_rng, shard_order = shuffle.make_rng, shuffle.shard_order


@dataclass
class ReferenceCorpus:
    """Planning columns of one or more datasets with global shard and sample numbers.

    Global shard g of source i is `shard_base[i] + local shard`; global sample
    ids index the concatenated columns.
    """

    columns: dict[str, np.ndarray]
    shard_sizes: np.ndarray            # samples per global shard
    shard_start: np.ndarray            # first global sample id of each global shard (+ end)
    shard_base: np.ndarray             # first global shard of each source (+ end)
    weights: np.ndarray

    @classmethod
    def build(cls, columns: list[dict[str, np.ndarray]], shard_sizes: list[np.ndarray],
              weights: list[float] | None = None) -> ReferenceCorpus:
        if not columns:
            raise ValueError("no datasets given")
        weights = np.asarray(weights if weights is not None else [1.0] * len(columns), dtype=np.float64)
        if len(weights) != len(columns) or (weights < 0).any() or weights.sum() <= 0:
            raise ValueError("mixing weights must be >= 0, one per dataset, not all zero")
        sizes = [np.asarray(s, dtype=np.int64) for s in shard_sizes]
        shard_base = np.concatenate([[0], np.cumsum([len(s) for s in sizes])]).astype(np.int64)
        if len(columns) == 1:
            cols = columns[0]
        else:
            img_base = np.concatenate([[0], np.cumsum([len(c["width"]) for c in columns])])
            cols = {
                "shard": np.concatenate([c["shard"].astype(np.int64) + b for c, b in zip(columns, shard_base)]),
                "local": np.concatenate([c["local"] for c in columns]),
                "text_tokens": np.concatenate([c["text_tokens"] for c in columns]),
                "n_images": np.concatenate([c["n_images"] for c in columns]),
                "image_start": np.concatenate([c["image_start"].astype(np.int64) + b for c, b in zip(columns, img_base)]),
                "width": np.concatenate([c["width"] for c in columns]),
                "height": np.concatenate([c["height"] for c in columns]),
            }
        all_sizes = np.concatenate(sizes)
        shard_start = np.concatenate([[0], np.cumsum(all_sizes)]).astype(np.int64)
        if shard_start[-1] != len(cols["shard"]):
            raise ValueError("planning columns and shard sizes disagree")
        return cls(cols, all_sizes, shard_start, shard_base, weights)

    @property
    def num_sources(self) -> int:
        return len(self.weights)

    def source_shards(self, i: int) -> int:
        return int(self.shard_base[i + 1] - self.shard_base[i])

    def source_samples(self, i: int) -> int:
        b0, b1 = self.shard_base[i], self.shard_base[i + 1]
        return int(self.shard_start[b1] - self.shard_start[b0])

    def source_of_shard(self, g: int) -> int:
        return int(np.searchsorted(self.shard_base, g, side="right") - 1)

    def samples_of_shards(self, shards: np.ndarray) -> np.ndarray:
        """Global sample ids of the given global shards, shard by shard."""
        starts = self.shard_start[shards]
        counts = self.shard_sizes[shards]
        total = int(counts.sum())
        first = np.cumsum(counts) - counts
        return np.repeat(starts - first, counts) + np.arange(total, dtype=np.int64)


@dataclass
class WindowPlan:
    """The packs of one window: pack p holds samples[bounds[p]:bounds[p+1]]."""

    samples: np.ndarray
    bounds: np.ndarray
    tokens: np.ndarray       # planned tokens per entry of `samples` (overlong ones at max_tokens)
    images: np.ndarray       # images per entry of `samples`
    dropped: Counter = field(default_factory=Counter)

    @property
    def num_packs(self) -> int:
        return len(self.bounds) - 1

    def pack(self, p: int) -> np.ndarray:
        return self.samples[self.bounds[p]:self.bounds[p + 1]]


@dataclass
class _Segment:
    source: int
    pass_: int
    window: int
    lo: int
    hi: int


class ReferencePlanner:
    """Lazily planned global pack sequence of one epoch."""

    def __init__(self, corpus: ReferenceCorpus, policy, options: PlanOptions, seed: int, epoch: int,
                 keep_windows: int = 4):
        self.corpus = corpus
        self.policy = policy
        self.options = options
        self.seed = int(seed)
        self.epoch = int(epoch)
        self._keep = keep_windows
        self._plans: OrderedDict[int, WindowPlan] = OrderedDict()
        self._src_windows: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._orders: dict[tuple[int, int], np.ndarray] = {}
        self._layout()
        self.counts: list[int] = []          # packs per planned window, windows planned in order
        self.starts: list[int] = [0]         # first global pack of each planned window (+ end)
        self._pending_drops: Counter = Counter()
        self._drops_at: dict[int, Counter] = {}

    # ---- windows: which samples each window holds --------------------------------------
    def _pass_order(self, i: int, p: int) -> np.ndarray:
        key = (i, p)
        if key not in self._orders:
            self._orders[key] = shard_order(self.corpus.source_shards(i), self.seed, self.epoch, i, p)
        return self._orders[key]

    def _pass_windows(self, i: int, p: int) -> np.ndarray:
        """Sample counts of the source windows of pass p of source i."""
        sizes = self.corpus.shard_sizes[self.corpus.shard_base[i] + self._pass_order(i, p)]
        w = self.options.window_shards
        return np.add.reduceat(sizes, np.arange(0, len(sizes), w)) if len(sizes) else np.zeros(0, np.int64)

    def _layout(self) -> None:
        c = self.corpus
        if c.num_sources == 1:
            sizes = self._pass_windows(0, 0)
            self.windows = [[_Segment(0, 0, k, 0, int(n))] for k, n in enumerate(sizes)]
            return
        total = self.options.mix_samples or sum(c.source_samples(i) for i in range(c.num_sources))
        weights = np.asarray([w if c.source_samples(i) else 0.0 for i, w in enumerate(c.weights)])
        if weights.sum() <= 0:
            raise ValueError("every dataset with a non-zero weight is empty")
        raw = total * weights / weights.sum()
        targets = np.floor(raw).astype(np.int64)
        # largest remainders get the samples left, so the counts add up to `total` exactly
        for i in np.argsort(-(raw - targets), kind="stable")[:total - int(targets.sum())]:
            targets[i] += 1
        targets = targets.tolist()
        n_windows = sum(-(-c.source_shards(i) // self.options.window_shards) for i in range(c.num_sources))
        avg = max(1, total // max(1, n_windows))
        n_mixed = max(1, -(-sum(targets) // avg))
        self.windows = [[] for _ in range(n_mixed)]
        for i, n_i in enumerate(targets):
            if n_i == 0:
                continue
            # the source's stream: passes of its windows, laid end to end
            spans = []                                   # (start, pass, window, size)
            pos, p = 0, 0
            while pos < n_i:
                for w, size in enumerate(self._pass_windows(i, p).tolist()):
                    if size:
                        spans.append((pos, p, w, size))
                        pos += size
                p += 1
            span_start = np.asarray([s[0] for s in spans], dtype=np.int64)
            for k in range(n_mixed):
                a, b = k * n_i // n_mixed, (k + 1) * n_i // n_mixed
                j = int(np.searchsorted(span_start, a, side="right") - 1)
                while a < b:
                    start, p, w, size = spans[j]
                    hi = min(b, start + size)
                    self.windows[k].append(_Segment(i, p, w, a - start, hi - start))
                    a = hi
                    j += 1

    @property
    def num_windows(self) -> int:
        return len(self.windows)

    def _source_window(self, i: int, p: int, w: int) -> np.ndarray:
        key = (i, p, w)
        got = self._src_windows.get(key)
        if got is None:
            ws = self.options.window_shards
            shards = self._pass_order(i, p)[w * ws:(w + 1) * ws] + self.corpus.shard_base[i]
            samples = self.corpus.samples_of_shards(shards)
            got = samples[make_rng(self.seed, WINDOW_SAMPLES, self.epoch, i, p, w).permutation(len(samples))]
            self._src_windows[key] = got
            while len(self._src_windows) > 2 * self.corpus.num_sources + 2:
                self._src_windows.popitem(last=False)
        return got

    def window_samples(self, k: int) -> np.ndarray:
        """Global sample ids of window k, shuffled."""
        parts = [self._source_window(s.source, s.pass_, s.window)[s.lo:s.hi] for s in self.windows[k]]
        if len(parts) == 1:
            return parts[0]
        samples = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return samples[make_rng(self.seed, MIX_SAMPLES, self.epoch, k).permutation(len(samples))]

    def window_shards(self, k: int) -> list[int]:
        """Global shards window k reads (those of its source windows), in shard order."""
        ws = self.options.window_shards
        out: list[int] = []
        for s in self.windows[k]:
            shards = self._pass_order(s.source, s.pass_)[s.window * ws:(s.window + 1) * ws]
            out.extend((shards + self.corpus.shard_base[s.source]).tolist())
        return list(dict.fromkeys(out))

    # ---- packing one window --------------------------------------------------------------
    def plan_window(self, k: int) -> WindowPlan:
        """The packs of window k (cached for the last few windows)."""
        got = self._plans.get(k)
        if got is not None:
            self._plans.move_to_end(k)
            return got
        opt = self.options
        cols = self.corpus.columns
        samples = self.window_samples(k)
        tokens, image_tokens = sample_lengths(cols, samples, self.policy)
        images = cols["n_images"][samples].astype(np.int64)
        dropped = Counter()
        too_many = images > opt.max_images
        over = tokens > opt.max_tokens
        unfit = over & ((image_tokens >= opt.max_tokens) | (opt.overlong == "drop"))
        if too_many.any():
            dropped[Skip.TOO_MANY_IMAGES] = int(too_many.sum())
        if (unfit & ~too_many).any():
            dropped[Skip.OVERLONG] = int((unfit & ~too_many).sum())
        keep = ~(too_many | unfit)
        samples, tokens, images = samples[keep], np.minimum(tokens[keep], opt.max_tokens), images[keep]
        if opt.mode == "pack":
            order, bounds = pack(tokens, images, opt.max_tokens, opt.max_images)
            # inside a pack, keep the window's shuffled order rather than the packer's (long first)
            pack_of = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
            order = order[np.lexsort((order, pack_of))]
        else:
            order, bounds = bucket(tokens, images, opt.max_tokens, opt.max_images)
        n_packs = len(bounds) - 1
        perm = make_rng(self.seed, PACK_ORDER, self.epoch, k).permutation(n_packs)
        sizes = np.diff(bounds)[perm]
        starts = bounds[:-1][perm]
        gather = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(int(sizes.sum()))
        order = order[gather]
        plan = WindowPlan(samples[order], np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                          tokens[order], images[order], dropped)
        self._plans[k] = plan
        while len(self._plans) > self._keep:
            self._plans.popitem(last=False)
        return plan

    # ---- the global pack sequence -----------------------------------------------------------
    @property
    def planned_windows(self) -> int:
        return len(self.counts)

    def _plan_next(self) -> None:
        k = len(self.counts)
        plan = self.plan_window(k)
        self.counts.append(plan.num_packs)
        self.starts.append(self.starts[-1] + plan.num_packs)
        self._pending_drops.update(plan.dropped)
        if plan.num_packs and self._pending_drops:
            self._drops_at[self.starts[-2]] = self._pending_drops
            self._pending_drops = Counter()
        if len(self.counts) == self.num_windows and self._pending_drops and self.starts[-1] > 0:
            self._drops_at.setdefault(self.starts[-1] - 1, Counter()).update(self._pending_drops)
            self._pending_drops = Counter()

    def ensure(self, g: int) -> bool:
        """Plan windows until global pack g (and the window after it) is known; False if g is past the end."""
        while self.starts[-1] <= g + 1 and len(self.counts) < self.num_windows:
            self._plan_next()
        return g < self.starts[-1]

    def total(self) -> int:
        """Packs in the whole epoch (plans every remaining window)."""
        while len(self.counts) < self.num_windows:
            self._plan_next()
        return self.starts[-1]

    def locate(self, g: int) -> tuple[int, int]:
        """(window, pack inside the window) of global pack g."""
        if not self.ensure(g):
            raise IndexError(f"pack {g} is past the end of epoch {self.epoch}")
        k = int(np.searchsorted(self.starts, g, side="right") - 1)
        return k, g - self.starts[k]

    def pack_samples(self, g: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(samples, planned tokens, images) of global pack g."""
        k, j = self.locate(g)
        plan = self.plan_window(k)
        sl = slice(plan.bounds[j], plan.bounds[j + 1])
        return plan.samples[sl], plan.tokens[sl], plan.images[sl]

    def drops_at(self, g: int) -> Counter:
        """Samples the plan dropped, reported with global pack g (each drop reported once)."""
        self.ensure(g)
        return self._drops_at.get(g, Counter())


# ---- rank assignment (vlmdata/plan/assign.py before issue 15) ----

def rank_pack(cursor: int, step: int, world: int, rank: int) -> int:
    """Global pack number of a rank's step (counted from `cursor`)."""
    return cursor + step * world + rank


@dataclass
class Assigned:
    """One step's pack for a rank: its samples and the world's resume cursor after the step."""

    samples: np.ndarray
    step: int
    cursor: int
    window: int | None                     # window of the pack, None for the re-split tail
    dropped: Counter = field(default_factory=Counter)


def reference_rank_packs(planner, base: int, world: int, rank: int, first_step: int = 0,
               stride: int = 1) -> Iterator[Assigned]:
    """The packs of `rank` for steps first_step, first_step + stride, ... counted from cursor `base`.

    A DataLoader worker w of nw uses first_step=w, stride=nw. `planner` is an EpochPlanner.
    """
    step = first_step
    while True:
        start = base + step * world
        if planner.ensure(start + world - 1):
            g = start + rank
            k, _ = planner.locate(g)
            yield Assigned(planner.pack_samples(g)[0], step, start + world, k, planner.drops_at(g))
        else:
            n = planner.total()
            if start >= n:
                return
            tail = [planner.pack_samples(g) for g in range(start, n)]
            tokens = {int(i): int(t) for p in tail for i, t in zip(p[0], p[1])}
            dropped = Counter()
            if rank == 0:
                for g in range(start, n):
                    dropped.update(planner.drops_at(g))
            yield Assigned(split_tail([p[0] for p in tail], tokens, world)[rank], step, n, None, dropped)
        step += stride
