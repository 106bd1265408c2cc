"""External sort of one stream of (key, value) pairs too large to sort in memory: sorted runs, spilled and merged.

The key sort falls back to this for a key range that outgrew memory (keys
arriving in order, or one prefix far more common than the sample said).
Runs are sorted `run_keys` pairs at a time and spilled to `.npy` files. Runs
that do not overlap (keys arriving in increasing or decreasing order) are
read back one after another; others are merged: a block of every run is
read, each run gives the keys up to the smallest last key among the blocks
(nothing later in any run can come before it), and a stable sort orders them
(for a concatenation of sorted pieces, a merge). Equal keys stay in arrival
order (the merge emits the copies of a key that ends a block run by run).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator

import numpy as np

__all__ = ["sort_in_runs"]

MERGE_BYTES = 128 << 20     # what the merge reads at a time from all runs together (bounds its memory)


class _RunFile:
    """A spilled .npy run read a block at a time with plain reads (a memory map would keep every page it
    touched in the process's RSS)."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            np.lib.format.read_magic(f)
            shape, _, self.dtype = np.lib.format.read_array_header_1_0(f)
            self.offset = f.tell()
        self.n = int(shape[0])

    def read(self, start: int, count: int) -> np.ndarray:
        return np.fromfile(self.path, dtype=self.dtype, count=count, offset=self.offset + start * self.dtype.itemsize)


def _cut(pieces: Iterable[tuple[np.ndarray, np.ndarray]], size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The pairs of `pieces` again, in pieces of exactly `size` (the last one shorter)."""
    keys: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    held = 0
    for k, v in pieces:
        while len(k):
            take = min(size - held, len(k))
            keys.append(k[:take])
            vals.append(v[:take])
            held += take
            k, v = k[take:], v[take:]
            if held == size:
                yield np.concatenate(keys), np.concatenate(vals)
                keys, vals, held = [], [], 0
    if held:
        yield np.concatenate(keys), np.concatenate(vals)


def sort_in_runs(pieces: Iterable[tuple[np.ndarray, np.ndarray]], run_keys: int, directory: str, block: int,
                 argsort: Callable[[np.ndarray], np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(keys, values) blocks of `pieces` (in arrival order) in key order, holding about `run_keys` pairs at once;
    `argsort` is a stable argsort of keys. The runs are spilled under `directory` and removed when done."""
    runs = []
    try:
        for n, (k, v) in enumerate(_cut(pieces, run_keys)):
            order = argsort(k)
            paths = (os.path.join(directory, f"run{n:05d}.keys.npy"), os.path.join(directory, f"run{n:05d}.vals.npy"))
            np.save(paths[0], k[order])
            np.save(paths[1], v[order])
            del k, v, order
            runs.append((_RunFile(paths[0]), _RunFile(paths[1])))
        ordered = _in_sequence(runs)
        if ordered is not None:
            for r in ordered:
                for i in range(0, r[0].n, block):
                    yield r[0].read(i, min(block, r[0].n - i)), r[1].read(i, min(block, r[0].n - i))
        else:
            yield from _merge(runs, block)
    finally:
        for r in runs:
            for f in r:
                os.unlink(f.path)


def _in_sequence(runs: list[tuple[_RunFile, _RunFile]]) -> list | None:
    """The runs in an order where each one's keys all come before the next one's (equal keys only from an earlier
    run to a later one), or None if they overlap."""
    ends = [(r[0].read(0, 1)[0], i, r[0].read(r[0].n - 1, 1)[0]) for i, r in enumerate(runs)]
    ends.sort(key=lambda e: (e[0], e[1]))
    for (_, i, last), (first, j, _) in zip(ends, ends[1:]):
        if not (last < first or (last == first and i < j)):
            return None
    return [runs[i] for _, i, _ in ends]


def _merge(runs: list[tuple[_RunFile, _RunFile]], block: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    width = max(r[0].dtype.itemsize for r in runs) + 8
    step = max(1024, min(block, MERGE_BYTES // (width * len(runs))))
    pos = [0] * len(runs)
    heads: dict[int, np.ndarray] = {}                # the unread rest of each run's current block

    def refill(r: int) -> None:
        heads[r] = runs[r][0].read(pos[r], min(step, runs[r][0].n - pos[r]))

    def take(r: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        got = heads[r][:count], runs[r][1].read(pos[r], count)
        heads[r] = heads[r][count:]
        pos[r] += count
        return got

    while True:
        live = [r for r in range(len(runs)) if pos[r] < runs[r][0].n]
        if not live:
            return
        for r in live:
            if len(heads.get(r, ())) == 0:
                refill(r)
        lasts = [heads[r][-1] for r in live if pos[r] + len(heads[r]) < runs[r][0].n]
        bound = min(lasts) if lasts else None
        # every key below the bound is in the heads, all its copies with it: a stable sort of them is a merge
        got = [take(r, len(heads[r]) if bound is None else int(np.searchsorted(heads[r], bound))) for r in live]
        keys, vals = np.concatenate([k for k, _ in got]), np.concatenate([v for _, v in got])
        if len(keys):
            order = np.argsort(keys, kind="stable")
            keys, vals = keys[order], vals[order]
            for i in range(0, len(keys), block):
                yield keys[i:i + block], vals[i:i + block]
        elif bound is not None:
            for k, v in _copies_in_run_order(live, bound, heads, runs, pos, refill, take):
                for i in range(0, len(k), block):
                    yield k[i:i + block], v[i:i + block]


def _copies_in_run_order(live, bound, heads, runs, pos, refill, take):
    """Every copy of `bound` (the smallest key left in any run), run after run, reading on through blocks."""
    for r in live:
        while pos[r] < runs[r][0].n:
            if not len(heads[r]):
                refill(r)
            count = int(np.searchsorted(heads[r], bound, side="right"))
            if count:
                yield take(r, count)
            if len(heads[r]):
                break
