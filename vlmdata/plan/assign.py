"""Assigning the global pack sequence to ranks and DataLoader workers.

The global sequence of an epoch is cut into steps of `world` consecutive
packs; rank r takes pack `cursor + s * world + r` at step s. `cursor` counts
packs consumed by the whole world, so resuming with another world size goes on
from the same cursor (nothing lost, nothing repeated).

The last, incomplete step (fewer than `world` packs left) is re-split over all
ranks (`split_tail`) so that every rank runs the same number of steps: no rank
waits forever for a collective that the others never enter. If the tail holds
fewer samples than there are ranks, the ranks left over get an empty pack (one
padding token, no label, no sample): they still take the step, with nothing to
learn from.

With a `Balance` (plan/balance.py) the step's samples are re-dealt among its
`world` packs so that the ranks' costs are even (the tail's too, after its
split); which samples a step holds, and so the cursor, is the same as without.
Bucket-mode packs are never re-dealt (a bucket is padded to its longest sample).

DataLoader worker w of nw takes the rank's steps w, w + nw, ... so the
DataLoader's in-order round robin hands the packs out in the rank's order.
"""
from __future__ import annotations

import weakref
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from vlmdata.plan.balance import Balance, StepDeal, balance_step


def rank_pack(cursor: int, step: int, world: int, rank: int) -> int:
    """Global pack number of a rank's step (counted from `cursor`)."""
    return cursor + step * world + rank


def split_tail(packs: list[np.ndarray], tokens: dict[int, int], world: int) -> list[np.ndarray]:
    """Re-split the samples of the last incomplete step into `world` packs.

    Starts from the tail's own packs (each within budget) and splits the
    heaviest pack that holds two or more samples into two token-balanced
    halves until there are `world` packs; splitting never breaks a budget.
    Returns `world` arrays of sample ids (some empty if samples run out).
    """
    parts = [np.asarray(p, dtype=np.int64) for p in packs if len(p)]
    while len(parts) < world:
        weights = [sum(tokens[int(i)] for i in p) if len(p) > 1 else -1 for p in parts]
        j = int(np.argmax(weights)) if parts else 0
        if not parts or weights[j] < 0:
            break
        items = sorted(parts[j].tolist(), key=lambda i: (-tokens[i], i))
        halves: list[list[int]] = [[], []]
        load = [0, 0]
        for i in items:                      # LPT into two halves
            h = 0 if load[0] <= load[1] else 1
            halves[h].append(i)
            load[h] += tokens[i]
        parts[j:j + 1] = [np.asarray(halves[0], np.int64), np.asarray(halves[1], np.int64)]
    parts.sort(key=lambda p: (-sum(tokens[int(i)] for i in p), p.tolist()))
    while len(parts) < world:
        parts.append(np.zeros(0, np.int64))
    return parts


@dataclass
class Assigned:
    """One step's pack for a rank: its samples and the world's resume cursor after the step."""

    samples: np.ndarray
    step: int
    cursor: int
    window: int | None                     # window of the pack, None for the re-split tail
    dropped: Counter = field(default_factory=Counter)
    cost: float | None = None              # the pack's cost under the balance target (None: not balanced)
    imbalance: float | None = None         # the step's slowest / mean rank cost, after balancing
    imbalance_before: float | None = None  # ... and as planned


def _deal(planner, parts: list[np.ndarray], source: range, balance: Balance) -> StepDeal:
    """Balance a step whose packs hold `parts`: the samples of global packs `source`, dealt in any way."""
    facts: dict[int, tuple] = {}
    for g in source:
        samples, tokens, images = planner.pack_samples(g)
        vis_tokens, vis_squares = planner.pack_vision(g)
        facts.update(zip(samples.tolist(), zip(tokens.tolist(), images.tolist(), vis_tokens.tolist(),
                                               vis_squares.tolist())))
    columns = [np.asarray([facts[i] for i in p.tolist()], dtype=np.int64).reshape(-1, 4) for p in parts]
    costs = [balance.costs(c[:, 0], c[:, 2], c[:, 3]) for c in columns]
    opts = planner.options
    # the pack's image budget as the planner applies it: images (max_images), vision patches (max_patches)
    merge = int(getattr(planner.policy, "merge", 1))
    budgets = [opts.image_budget(c[:, 1], c[:, 2], merge) for c in columns]
    limit = budgets[0][1] if budgets else 0
    return balance_step(parts, [c[:, 0] for c in columns], [b[0] for b in budgets], costs,
                        opts.max_tokens, limit, balance)


# A worker deals each of its steps twice: when it announces a window's shard reads, then when it builds the
# step's pack. The deals are kept per planner (one epoch of one dataset copy), the most recent ones only.
_DEALS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
KEEP_DEALS = 4096


def step_deal(planner, start: int, world: int, balance: Balance) -> StepDeal:
    """The balanced deal of the full step made of global packs start .. start + world - 1 (memoised)."""
    deals = _DEALS.setdefault(planner, OrderedDict())
    key = (start, world, balance)
    deal = deals.get(key)
    if deal is None:
        source = range(start, start + world)
        deal = deals[key] = _deal(planner, [planner.pack_samples(g)[0] for g in source], source, balance)
        if len(deals) > KEEP_DEALS:
            deals.popitem(last=False)
    return deal


def balances(planner, balance: Balance | None) -> bool:
    """Whether steps of this planner are re-dealt under `balance`."""
    return balance is not None and balance.active and planner.options.mode == "pack"


def rank_step_samples(planner, start: int, world: int, rank: int, balance: Balance | None) -> np.ndarray:
    """The samples rank `rank` trains on in the full step starting at global pack `start`."""
    if balances(planner, balance):
        return step_deal(planner, start, world, balance).samples[rank]
    return planner.pack_samples(start + rank)[0]


def rank_packs(planner, base: int, world: int, rank: int, first_step: int = 0,
               stride: int = 1, balance: Balance | None = None) -> Iterator[Assigned]:
    """The packs of `rank` for steps first_step, first_step + stride, ... counted from cursor `base`.

    A DataLoader worker w of nw uses first_step=w, stride=nw. `planner` is an EpochPlanner.
    `balance`: re-deal each step's samples among its packs (module docstring); None: as planned.
    """
    step = first_step
    balanced = balances(planner, balance)
    while True:
        start = base + step * world
        if planner.ensure(start + world - 1):
            g = start + rank
            k, _ = planner.locate(g)
            if balanced:
                deal = step_deal(planner, start, world, balance)
                yield Assigned(deal.samples[rank], step, start + world, k, planner.drops_at(g),
                               float(deal.cost_after[rank]), deal.imbalance, deal.imbalance_before)
            else:
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
            parts = split_tail([p[0] for p in tail], tokens, world)
            if balanced:
                deal = _deal(planner, parts, range(start, n), balance)
                yield Assigned(deal.samples[rank], step, n, None, dropped, float(deal.cost_after[rank]),
                               deal.imbalance, deal.imbalance_before)
            else:
                yield Assigned(parts[rank], step, n, None, dropped)
        step += stride
