"""Compute-balanced steps: packs of similar cost side by side, and each step's samples re-dealt among its packs.

Two parts, both deterministic:

* **The plan's pack order** (world-size independent, `serpentine_order`): inside
  each window the shuffled packs are cut into blocks of `block` packs, and each
  block is sorted by cost, descending and ascending in turn, so that a window
  starts and ends with its costliest packs. Any `world` consecutive packs (a
  step, whatever the world size) then cost about the same, and blocks and
  windows meet at similar costs. The price: within a block, cheaper packs
  come before costlier ones (or the reverse); which samples a pack holds is
  still the shuffled packer's.
* **Each step's deal** (`balance_step`, used by `assign.rank_packs`). A step
  is `world` consecutive packs of the global sequence, one per rank; its time
  is its slowest rank's. Which packs form a step is fixed by the plan (so
  exactly once, the world-size independent order and resume from any cursor
  hold as before); the deal only moves the step's samples between its packs,
  within the token and image budgets. Two candidates: the planned packs, and a
  greedy deal (costliest sample first, into the cheapest pack it fits; it fails
  when the packs are too full to be dealt differently). Each is improved by
  local search: the single move of a sample out of the costliest pack, or swap
  with another pack's sample, that lowers the larger of the two packs' costs
  most, until the costliest is within `tolerance` of the mean or no move helps.
  The candidate with the lower maximum wins. The deal is a pure function of the
  step's packs, so every rank (and worker) computes the same one.

`target`: "compute" (the `CostModel`'s FLOPs), "tokens" (planned tokens) or
"none" (the planned packs as they are, in the shuffled order).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vlmdata.plan.cost import CostModel

__all__ = ["Balance", "StepDeal", "balance_step", "serpentine_order"]

TARGETS = ("compute", "tokens", "none")


@dataclass(frozen=True)
class Balance:
    """How a step's packs are evened out across ranks (see the module docstring)."""

    target: str = "compute"
    tolerance: float = 0.005        # stop once the costliest pack is within this fraction of the mean
    cost: CostModel = field(default_factory=CostModel)
    max_moves: int = 4              # moves per pack of the step, at most
    block: int = 512                # packs sorted by cost together in the plan's order (0: keep the shuffle)

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"balance target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        if self.tolerance < 0 or self.max_moves < 0 or self.block < 0:
            raise ValueError("balance tolerance, max_moves and block must be >= 0")

    @classmethod
    def of(cls, value: Balance | str | None) -> Balance:
        """A Balance from itself, a target name, or None ("none")."""
        if isinstance(value, Balance):
            return value
        return cls(target=value or "none")

    @property
    def active(self) -> bool:
        return self.target != "none"

    def costs(self, tokens, image_tokens, image_squares) -> np.ndarray:
        """Per-sample cost under this target."""
        if self.target == "tokens":
            return np.asarray(tokens, dtype=np.float64)
        return self.cost.sample_costs(tokens, image_tokens, image_squares)


def serpentine_order(pack_costs: np.ndarray, block: int) -> np.ndarray:
    """An order of packs (given in shuffled order) that starts and ends with the costliest: blocks of
    `block` packs, each sorted by cost, descending and ascending in turn; a last block that would end
    cheap is laid out as a V (every other pack down, the rest back up). Ties keep their position."""
    n = len(pack_costs)
    if block <= 1 or n < 2:
        return np.arange(n)
    costs = np.asarray(pack_costs, dtype=np.float64)
    parts = []
    n_blocks = -(-n // block)
    for j in range(n_blocks):
        pos = np.arange(j * block, min(n, (j + 1) * block))
        down = pos[np.lexsort((pos, -costs[pos]))]
        if j % 2:
            parts.append(down[::-1])
        elif j == n_blocks - 1:
            parts.append(np.concatenate([down[0::2], down[1::2][::-1]]))
        else:
            parts.append(down)
    return np.concatenate(parts)


@dataclass
class StepDeal:
    """A step's packs after balancing: pack r (rank r's) holds `samples[r]`; each pack's cost before and after."""

    samples: list[np.ndarray]
    cost_before: np.ndarray
    cost_after: np.ndarray

    @staticmethod
    def ratio(costs: np.ndarray) -> float:
        """Slowest rank over the mean rank (1.0 for an empty step)."""
        mean = float(np.mean(costs)) if len(costs) else 0.0
        return float(np.max(costs)) / mean if mean > 0 else 1.0

    @property
    def imbalance_before(self) -> float:
        return self.ratio(self.cost_before)

    @property
    def imbalance(self) -> float:
        return self.ratio(self.cost_after)


def _best_move(h: int, pack: np.ndarray, tok: np.ndarray, img: np.ndarray, cost: np.ndarray,
               load: np.ndarray, used: np.ndarray, pics: np.ndarray, max_tokens: int, max_images: int):
    """The move out of pack h (sample x to another pack, alone or swapped with its sample y) that lowers
    max(cost h, cost other) most: (x, y or -1, other pack) or None."""
    xs = np.flatnonzero(pack == h)
    others = np.flatnonzero(pack != h)
    n_packs = len(load)
    # candidates y: every other pack's samples, and one empty slot per other pack (a plain move)
    holes = np.setdiff1d(np.arange(n_packs), [h])
    y_pack = np.concatenate([pack[others], holes])
    y_tok = np.concatenate([tok[others], np.zeros(len(holes), np.int64)])
    y_img = np.concatenate([img[others], np.zeros(len(holes), np.int64)])
    y_cost = np.concatenate([cost[others], np.zeros(len(holes))])
    d = cost[xs][:, None] - y_cost[None, :]                       # cost moved from h to the other pack
    dt = tok[xs][:, None] - y_tok[None, :]
    di = img[xs][:, None] - y_img[None, :]
    fits = ((used[y_pack][None, :] + dt <= max_tokens) & (used[h] - dt <= max_tokens)
            & (pics[y_pack][None, :] + di <= max_images) & (pics[h] - di <= max_images) & (d > 0))
    if not fits.any():
        return None
    pair_max = np.where(fits, np.maximum(load[h] - d, load[y_pack][None, :] + d), np.inf)
    flat = int(np.argmin(pair_max))
    if not pair_max.flat[flat] < load[h] * (1 - 1e-12):
        return None
    i, j = divmod(flat, pair_max.shape[1])
    y = int(others[j]) if j < len(others) else -1
    return int(xs[i]), y, int(y_pack[j])


def _greedy_deal(tok: np.ndarray, img: np.ndarray, cost: np.ndarray, n_packs: int, max_tokens: int,
                 max_images: int) -> np.ndarray | None:
    """Costliest sample first, each into the cheapest pack it fits in (LPT under the budgets); None when a
    sample fits nowhere (full packs leave no room to deal them differently)."""
    pack = np.empty(len(tok), np.int64)
    load = np.zeros(n_packs)
    used = np.zeros(n_packs, np.int64)
    pics = np.zeros(n_packs, np.int64)
    for s in np.lexsort((np.arange(len(tok)), -cost)).tolist():
        fits = np.flatnonzero((used + tok[s] <= max_tokens) & (pics + img[s] <= max_images))
        if not len(fits):
            return None
        r = int(fits[np.argmin(load[fits])])
        pack[s] = r
        load[r] += cost[s]
        used[r] += tok[s]
        pics[r] += img[s]
    return pack


def _improve(pack: np.ndarray, tok: np.ndarray, img: np.ndarray, cost: np.ndarray, n_packs: int,
             max_tokens: int, max_images: int, balance: Balance) -> np.ndarray:
    """Local search: the best single move or swap out of the costliest pack, until none helps."""
    pack = pack.copy()
    load = np.bincount(pack, weights=cost, minlength=n_packs)
    used = np.bincount(pack, weights=tok, minlength=n_packs).astype(np.int64)
    pics = np.bincount(pack, weights=img, minlength=n_packs).astype(np.int64)
    limit = (1 + balance.tolerance) * load.mean()
    for _ in range(balance.max_moves * n_packs):
        h = int(np.argmax(load))
        if load[h] <= limit:
            break
        move = _best_move(h, pack, tok, img, cost, load, used, pics, max_tokens, max_images)
        if move is None:
            break
        x, y, q = move
        for s, src, dst in ((x, h, q), (y, q, h)):
            if s < 0:
                continue
            pack[s] = dst
            load[src] -= cost[s]
            load[dst] += cost[s]
            used[src] -= tok[s]
            used[dst] += tok[s]
            pics[src] -= img[s]
            pics[dst] += img[s]
    return pack


def balance_step(packs: list[np.ndarray], tokens: list[np.ndarray], images: list[np.ndarray],
                 costs: list[np.ndarray], max_tokens: int, max_images: int, balance: Balance) -> StepDeal:
    """Re-deal the samples of one step's packs (sample ids, with per-sample tokens, image-budget use and
    costs) so that the costliest pack comes as close to the mean as single moves and swaps within budget
    allow. `images`/`max_images` are the pack's image budget in the planner's unit (images, or vision
    patches under max_patches; all zeros and 0 when there is no image budget).
    A sample keeps its relative order within the pack it lands in (planned packs first)."""
    n_packs = len(packs)
    sizes = [len(p) for p in packs]
    pack = np.repeat(np.arange(n_packs), sizes)
    ids = np.concatenate(packs).astype(np.int64) if n_packs else np.zeros(0, np.int64)
    tok = np.concatenate(tokens).astype(np.int64) if n_packs else np.zeros(0, np.int64)
    img = np.concatenate(images).astype(np.int64) if n_packs else np.zeros(0, np.int64)
    cost = np.concatenate(costs).astype(np.float64) if n_packs else np.zeros(0)
    before = np.bincount(pack, weights=cost, minlength=n_packs)
    if balance.active and n_packs > 1 and len(ids):
        best = _improve(pack, tok, img, cost, n_packs, max_tokens, max_images, balance)
        dealt = _greedy_deal(tok, img, cost, n_packs, max_tokens, max_images)
        if dealt is not None:
            dealt = _improve(dealt, tok, img, cost, n_packs, max_tokens, max_images, balance)
            if np.bincount(dealt, weights=cost, minlength=n_packs).max() < \
                    np.bincount(best, weights=cost, minlength=n_packs).max():
                best = dealt
        pack = best
    out = [ids[pack == r] for r in range(n_packs)]
    after = np.asarray([cost[pack == r].sum() for r in range(n_packs)])
    return StepDeal(out, before, after)
