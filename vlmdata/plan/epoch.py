"""The plan: a pure function of (planning columns, seed, epoch, options) giving the global pack sequence.

    shard order (shuffled per epoch)
      -> windows of `window_shards` shards
      -> samples shuffled inside each window
      -> per-sample tokens = text tokens + image-policy tokens of each image
      -> overlong samples truncated (planned at max_tokens) or dropped
      -> packed (or bucketed) under max_tokens and an image budget (max_images per pack, or max_patches:
         vision patches per pack, for a vision tower that runs varlen over them), packs shuffled in the window
      -> windows concatenated: the epoch's global pack sequence

Windows are planned lazily, on demand: the first packs of a huge dataset are
ready after planning one window. Nothing depends on the world size or the
number of DataLoader workers.

Memory is O(shards + window), never O(samples): the `Corpus` holds per-shard
counts and reads a window's planning columns when the window is planned
(`formats.planning.PlanningColumns` reads the byte ranges of its shards from planning.npz;
`ArrayColumns` wraps columns already in memory). Window k's packs depend only
on (seed, epoch, k), so numbering the packs needs only each earlier window's
pack count. A planner starts from an anchor, a window whose first global pack
is known (window 0 at pack 0, or one a resume state names), and learns counts
forward (and backward, if asked for a pack before its anchor): resuming in
the middle of an epoch plans one or two windows, not every earlier one. The
`WindowStore` it is given decides where planned windows and counts live:
in the process (`LocalWindows`) or shared by a rank's or node's processes
(`plan.shared`).

Several datasets mix by weight: source i contributes n_i ~ w_i / sum(w) * total (largest remainders)
samples per epoch (repeating or sub-sampling its own shuffled stream of
windows), and mixed window k takes the k-th equal slice of every source's
stream, shuffled together. A single dataset's windows are its own windows.
"""
from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from vlmdata.errors import Skip
from vlmdata.plan.balance import Balance, serpentine_order
from vlmdata.plan.bucketing import bucket
from vlmdata.plan.lengths import image_rows, image_token_squares, sample_lengths
from vlmdata.plan.packing import pack
from vlmdata.plan.shuffle import MIX_SAMPLES, PACK_ORDER, WINDOW_SAMPLES, make_rng, shard_order
from vlmdata.plan.window_store import LocalWindows, WindowPlan, WindowStore

__all__ = ["ArrayColumns", "Corpus", "EpochPlanner", "PlanOptions", "ShardColumns"]


@dataclass(frozen=True)
class PlanOptions:
    """What shapes the plan (all of it is part of the resume fingerprint)."""

    max_tokens: int = 8192
    max_images: int | None = 16     # images per pack at most (None: no image count limit)
    window_shards: int = 8
    mode: str = "pack"              # "pack" | "bucket"
    overlong: str = "truncate"      # "truncate" | "drop"
    mix_samples: int | None = None  # samples per mixed epoch; default: all sources' sizes summed
    max_patches: int | None = None  # vision patches per pack at most, instead of max_images (image tokens x merge^2)
    balance: Balance = Balance("none")  # packs of similar cost side by side (plan.balance); "none": shuffled

    def __post_init__(self) -> None:
        if self.mode not in ("pack", "bucket"):
            raise ValueError(f"mode must be 'pack' or 'bucket', got {self.mode!r}")
        if self.overlong not in ("truncate", "drop"):
            raise ValueError(f"overlong must be 'truncate' or 'drop', got {self.overlong!r}")
        if self.max_tokens < 1 or (self.max_images or 0) < 0 or (self.max_patches or 0) < 0 or self.window_shards < 1:
            raise ValueError("max_tokens and window_shards must be >= 1, max_images and max_patches >= 0")
        if self.max_images is not None and self.max_patches is not None:
            raise ValueError("give an image budget per pack as max_images or as max_patches, not both")

    def image_budget(self, images: np.ndarray, image_tokens: np.ndarray, merge: int) -> tuple[np.ndarray, int]:
        """(each sample's cost, the budget per pack) of the image limit: its images (max_images), its vision
        patches (max_patches: image tokens x merge^2), or nothing (neither)."""
        if self.max_patches is not None:
            return image_tokens * (merge * merge), self.max_patches
        if self.max_images is not None:
            return images, self.max_images
        return np.zeros_like(images), 0


class ShardColumns(Protocol):
    """One dataset's planning columns, read a few shards at a time."""

    def read_shards(self, shards) -> dict[str, np.ndarray]:
        """text_tokens, n_images (per sample), width, height (per image) and image_start (into them)
        of these (local) shards' samples, shard after shard in the given order."""


class ArrayColumns:
    """Planning columns already in memory (a dict as in planning.npz), read like a planning file."""

    def __init__(self, columns: dict[str, np.ndarray], shard_sizes):
        self.columns = columns
        sizes = np.asarray(shard_sizes, dtype=np.int64)
        self.sample_start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        if self.sample_start[-1] != len(columns["n_images"]):
            raise ValueError("planning columns and shard sizes disagree")

    def read_shards(self, shards) -> dict[str, np.ndarray]:
        st = self.sample_start
        shards = np.asarray(shards, dtype=np.int64)
        counts = st[shards + 1] - st[shards]
        first = np.cumsum(counts) - counts
        samples = np.repeat(st[shards] - first, counts) + np.arange(int(counts.sum()), dtype=np.int64)
        cols = self.columns
        _, rows = image_rows(cols, samples)
        n_img = cols["n_images"][samples]
        n64 = n_img.astype(np.int64)
        out = {"text_tokens": cols["text_tokens"][samples], "n_images": n_img, "width": cols["width"][rows],
               "height": cols["height"][rows], "image_start": np.cumsum(n64) - n64}
        if "video_tokens" in cols:
            out["video_tokens"] = cols["video_tokens"][samples]
        return out


@dataclass
class Corpus:
    """One or more datasets with global shard and sample numbers; O(shards) in memory.

    Global shard g of source i is `shard_base[i] + local shard`; global sample
    ids number the sources' samples shard after shard (source 0 first).
    """

    sources: list[ShardColumns]
    shard_sizes: np.ndarray            # samples per global shard
    shard_start: np.ndarray            # first global sample id of each global shard (+ end)
    shard_base: np.ndarray             # first global shard of each source (+ end)
    weights: np.ndarray

    @classmethod
    def build(cls, columns: list, shard_sizes: list[np.ndarray], weights: list[float] | None = None) -> Corpus:
        """`columns[i]`: source i's ShardColumns (e.g. a PlanningColumns), or its columns as a dict of arrays."""
        if not columns:
            raise ValueError("no datasets given")
        weights = np.asarray(weights if weights is not None else [1.0] * len(columns), dtype=np.float64)
        if len(weights) != len(columns) or (weights < 0).any() or weights.sum() <= 0:
            raise ValueError("mixing weights must be >= 0, one per dataset, not all zero")
        sizes = [np.asarray(s, dtype=np.int64) for s in shard_sizes]
        if len(sizes) != len(columns):
            raise ValueError("one array of shard sizes per dataset is needed")
        sources = [ArrayColumns(c, s) if isinstance(c, dict) else c for c, s in zip(columns, sizes)]
        shard_base = np.concatenate([[0], np.cumsum([len(s) for s in sizes])]).astype(np.int64)
        all_sizes = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
        shard_start = np.concatenate([[0], np.cumsum(all_sizes)]).astype(np.int64)
        return cls(sources, all_sizes, shard_start, shard_base, weights)

    @property
    def num_sources(self) -> int:
        return len(self.weights)

    @property
    def num_samples(self) -> int:
        return int(self.shard_start[-1])

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

    def shard_of(self, samples) -> np.ndarray:
        """Global shard of each global sample id (empty shards never hold one)."""
        return np.searchsorted(self.shard_start, np.asarray(samples, dtype=np.int64), side="right") - 1

    def local_of(self, samples) -> np.ndarray:
        """Row of each global sample id inside its shard."""
        samples = np.asarray(samples, dtype=np.int64)
        return samples - self.shard_start[self.shard_of(samples)]

    def gather(self, samples: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """(columns, rows): the planning columns of the shards holding `samples`, read now, and the row of
        each sample in them (`sample_lengths(columns, rows, policy)` gives their lengths)."""
        samples = np.asarray(samples, dtype=np.int64)
        shard = self.shard_of(samples)
        shards = np.unique(shard)
        parts = []
        for i in range(self.num_sources):
            lo, hi = np.searchsorted(shards, [self.shard_base[i], self.shard_base[i + 1]])
            if hi > lo:
                parts.append(self.sources[i].read_shards(shards[lo:hi] - self.shard_base[i]))
        names = ("text_tokens", "n_images", "width", "height")
        cols = {n: (np.concatenate([p[n] for p in parts]) if parts else np.zeros(0, np.int32)) for n in names}
        if any("video_tokens" in p for p in parts):      # sources without clips count 0 video tokens
            cols["video_tokens"] = np.concatenate([p.get("video_tokens", np.zeros(len(p["text_tokens"]), np.int32))
                                                   for p in parts])
        n_img = cols["n_images"].astype(np.int64)
        cols["image_start"] = np.cumsum(n_img) - n_img
        sizes = self.shard_sizes[shards]
        table_start = np.cumsum(sizes) - sizes
        rows = table_start[np.searchsorted(shards, shard)] + (samples - self.shard_start[shard])
        return cols, rows


@dataclass
class _Segment:
    source: int
    pass_: int
    window: int
    lo: int
    hi: int


class EpochPlanner:
    """Lazily planned global pack sequence of one epoch (see the module docstring).

    `store`: a WindowStore, or a function of the number of windows giving one
    (default: `LocalWindows(keep_windows)`, this planner's own).
    `anchor`: (window k, its first global pack), e.g. from a resume state;
    default (0, 0). Any pack can be asked for whatever the anchor.
    """

    def __init__(self, corpus: Corpus, policy, options: PlanOptions, seed: int, epoch: int,
                 keep_windows: int = 4, store: WindowStore | Callable[[int], WindowStore] | None = None,
                 anchor: tuple[int, int] | None = None):
        self.corpus = corpus
        self.policy = policy
        self.options = options
        self.seed = int(seed)
        self.epoch = int(epoch)
        self._src_windows: dict[tuple, np.ndarray] = {}
        self._orders: dict[tuple[int, int], np.ndarray] = {}
        self._layout()
        n = self.num_windows
        if store is None:
            store = LocalWindows(keep_windows)
        elif not hasattr(store, "get"):
            store = store(n)
        self.store: WindowStore = store
        # plain lists, not arrays: every pack a worker takes looks these up (numpy scalars cost ~10x more)
        self._count = [-1] * n                          # packs per window, -1: not known here yet
        self._start = [-1] * (n + 1)                    # first global pack of each window (+ end)
        k, first = (0, 0) if anchor is None else (int(anchor[0]), int(anchor[1]))
        if not 0 <= k <= n or first < 0 or (k == 0 and first != 0):
            raise ValueError(f"plan anchor {anchor} is not a window of this epoch's {n} windows")
        self._start[k] = first
        self._lo = self._hi = k                         # counts known for windows [lo, hi), starts for [lo, hi]
        self._last_window = (-1, 0, 0)                  # (k, first, end) of the window located last
        self._last_plan: tuple[int, WindowPlan | None] = (-1, None)

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
                del self._src_windows[next(iter(self._src_windows))]
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
    def _compute_window(self, k: int) -> WindowPlan:
        opt = self.options
        samples = self.window_samples(k)
        cols, rows = self.corpus.gather(samples)
        tokens, image_tokens = sample_lengths(cols, rows, self.policy)
        squares = image_token_squares(cols, rows, self.policy)
        images = cols["n_images"][rows].astype(np.int64)
        cost, budget = opt.image_budget(images, image_tokens, int(getattr(self.policy, "merge", 1)))
        dropped = Counter()
        too_many = cost > budget
        over = tokens > opt.max_tokens
        unfit = over & ((image_tokens >= opt.max_tokens) | (opt.overlong == "drop"))
        if too_many.any():
            dropped[Skip.TOO_MANY_IMAGES] = int(too_many.sum())
        if (unfit & ~too_many).any():
            dropped[Skip.OVERLONG] = int((unfit & ~too_many).sum())
        keep = ~(too_many | unfit)
        samples, tokens, images, cost = samples[keep], np.minimum(tokens[keep], opt.max_tokens), images[keep], cost[keep]
        image_tokens, squares = image_tokens[keep], squares[keep]
        if opt.mode == "pack":
            order, bounds = pack(tokens, cost, opt.max_tokens, budget)
            # inside a pack, keep the window's shuffled order rather than the packer's (long first)
            pack_of = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
            order = order[np.lexsort((order, pack_of))]
        else:
            order, bounds = bucket(tokens, cost, opt.max_tokens, budget)
        n_packs = len(bounds) - 1
        perm = make_rng(self.seed, PACK_ORDER, self.epoch, k).permutation(n_packs)
        if opt.balance.active and opt.balance.block > 1 and opt.mode == "pack":
            pack_of = np.repeat(np.arange(n_packs), np.diff(bounds))
            costs = opt.balance.costs(tokens[order], image_tokens[order], squares[order])
            perm = perm[serpentine_order(np.bincount(pack_of, weights=costs, minlength=n_packs)[perm],
                                         opt.balance.block)]
        sizes = np.diff(bounds)[perm]
        starts = bounds[:-1][perm]
        gather = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(int(sizes.sum()))
        order = order[gather]
        return WindowPlan(samples[order], np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                          tokens[order], images[order], dropped, image_tokens[order], squares[order])

    def plan_window(self, k: int) -> WindowPlan:
        """The packs of window k (from the store, or planned now)."""
        last_k, last = self._last_plan
        if last_k == k:
            return last
        if not 0 <= k < self.num_windows:
            raise IndexError(f"window {k} is not in [0, {self.num_windows})")
        plan = self.store.get(k, lambda: self._compute_window(k))
        self._count[k] = plan.num_packs
        self._last_plan = (k, plan)
        return plan

    # ---- the global pack sequence -----------------------------------------------------------
    def _count_of(self, k: int) -> int:
        """Packs of window k: known here, known to the store (planned by a process sharing it), or planned now."""
        c = self._count[k]
        if c < 0:
            known = self.store.count(k)
            c = known if known is not None else self.plan_window(k).num_packs
            self._count[k] = c
        return c

    def _forward(self) -> None:
        k = self._hi
        self._start[k + 1] = self._start[k] + self._count_of(k)
        self._hi += 1

    def _backward(self) -> None:
        k = self._lo - 1
        self._start[k] = self._start[k + 1] - self._count_of(k)
        if self._start[k] < 0 or (k == 0 and self._start[0] != 0):
            raise ValueError(f"the plan anchor (a resume state's window hint) does not match epoch {self.epoch}'s "
                             "plan: the state belongs to other data or settings")
        self._lo -= 1

    @property
    def planned_windows(self) -> int:
        """Windows whose pack counts this planner knows (contiguous from its anchor)."""
        return self._hi - self._lo

    @property
    def starts(self) -> list[int]:
        """First global pack of windows 0, 1, ... as far as known (+ the end once every window is)."""
        if self._lo > 0:
            raise ValueError("this planner started from a later window; use window_range(k)")
        return self._start[:self._hi + 1]

    @property
    def counts(self) -> list[int]:
        """Packs of windows 0, 1, ... as far as known (from window 0)."""
        return np.diff(self.starts).tolist()

    def window_range(self, k: int, learn: bool = False) -> tuple[int, int] | None:
        """(first, end) global packs of window k if known (`learn`: learning window counts up to k if
        needed), else None."""
        if learn and 0 <= k < self.num_windows:
            while self._hi <= k:
                self._forward()
            while self._lo > k:
                self._backward()
        if self._lo <= k < self._hi:
            return self._start[k], self._start[k + 1]
        return None

    def anchor_for(self, cursor: int) -> tuple[int, int] | None:
        """A window known to start at or before global pack `cursor`, with its start: what a resume state
        carries so that a planner resuming there starts from that window (None if none is known)."""
        k = bisect_right(self._start, cursor, self._lo, self._hi + 1) - 1
        return None if k < self._lo else (k, self._start[k])

    def ensure(self, g: int) -> bool:
        """Learn window counts until global pack g (and the one after it) is located; False if g is past the end."""
        while self._lo > 0 and g < self._start[self._lo]:
            self._backward()
        while self._start[self._hi] <= g + 1 and self._hi < self.num_windows:
            self._forward()
        return self._start[self._lo] <= g < self._start[self._hi]

    def total(self) -> int:
        """Packs in the whole epoch (learns the count of every remaining window)."""
        while self._hi < self.num_windows:
            self._forward()
        return int(self._start[self._hi])

    def window_samples_count(self, k: int) -> int:
        """Samples window k holds (from the layout: nothing planned)."""
        return sum(s.hi - s.lo for s in self.windows[k])

    def estimate_total(self, windows: int = 4) -> int:
        """Packs in the whole epoch, estimated by planning `windows` windows spread over it (with every window
        whose count is already known) and scaling their packs per sample to the others; exact (`total()`)
        when that covers every window."""
        n = self.num_windows
        if windows >= n:
            return self.total()
        for k in sorted(set(np.linspace(0, n - 1, max(1, windows)).round().astype(int).tolist())):
            self._count_of(k)
        counts = [self._count[k] if self._count[k] >= 0 else self.store.count(k) for k in range(n)]
        sizes = [self.window_samples_count(k) for k in range(n)]
        known = [(c, m) for c, m in zip(counts, sizes) if c is not None and c >= 0]
        per_sample = sum(c for c, _ in known) / max(1, sum(m for _, m in known))
        return int(round(sum(c if c is not None and c >= 0 else per_sample * m for c, m in zip(counts, sizes))))

    def locate(self, g: int) -> tuple[int, int]:
        """(window, pack inside the window) of global pack g."""
        k, first, end = self._last_window
        if first <= g < end:
            return k, g - first
        if not self.ensure(g):
            raise IndexError(f"pack {g} is past the end of epoch {self.epoch}")
        k = bisect_right(self._start, g, self._lo, self._hi + 1) - 1
        self._last_window = (k, self._start[k], self._start[k + 1])
        return k, g - self._start[k]

    def pack_samples(self, g: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(samples, planned tokens, images) of global pack g."""
        k, j = self.locate(g)
        plan = self.plan_window(k)
        sl = slice(plan.bounds[j], plan.bounds[j + 1])
        return plan.samples[sl], plan.tokens[sl], plan.images[sl]

    def pack_vision(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """(image tokens, sum of each image's tokens squared) per sample of global pack g."""
        k, j = self.locate(g)
        plan = self.plan_window(k)
        sl = slice(plan.bounds[j], plan.bounds[j + 1])
        if plan.image_tokens is None:
            raise ValueError(f"window {k} was planned without image token columns")
        return plan.image_tokens[sl], plan.image_squares[sl]

    def drops_at(self, g: int) -> Counter:
        """Samples the plan dropped, reported with global pack g (each drop reported once).

        A window's drops go with its first pack, together with those of the
        pack-less windows just before it; the drops of pack-less windows at
        the end of the epoch go with its last pack.
        """
        out: Counter = Counter()
        if not self.ensure(g):
            return out
        k, j = self.locate(g)
        if j == 0:
            out.update(self.plan_window(k).dropped)
            b = k - 1
            while b >= 0 and self._count_of(b) == 0:
                out.update(self.plan_window(b).dropped)
                b -= 1
        if self._hi == self.num_windows and g == self._start[self._hi] - 1:
            b = self.num_windows - 1
            while b > k and self._count_of(b) == 0:
                out.update(self.plan_window(b).dropped)
                b -= 1
        return out
