"""The epoch and resume point, shared with DataLoader workers that outlive an epoch (persistent_workers=True).

A DataLoader worker gets its own copy of the dataset when it starts, and with persistent_workers=True
it keeps that copy for every later epoch: `set_epoch()` or `load_state_dict()` called afterwards on the
main process's dataset would not reach it. `SharedPosition` is a tiny shared-memory array created with
the dataset, before any worker exists, holding (generation, epoch, cursor). The main process publishes
every change under a new generation; a worker, when it starts an iteration, adopts the published
position if its generation is newer than the last one that copy applied. (A state loaded inside a
worker, as StatefulDataLoader does, marks itself current, so it is not overridden by an older value.)

One process writes (the main one); readers check the generation before and after reading the values
(a sequence lock), so a read never mixes two positions. The array reaches workers by inheritance (fork)
or by pickling while a worker process is being spawned (spawn, forkserver); any other pickling (a copy,
a remote actor) gives an unshared position holding the same values.
"""
from __future__ import annotations

import multiprocessing
from multiprocessing import context as mp_context

__all__ = ["SharedPosition"]


class SharedPosition:
    """(generation, epoch, cursor) in shared memory; `publish` from the main process, `read` anywhere."""

    def __init__(self, epoch: int = 0, cursor: int = 0):
        self._array = multiprocessing.RawArray("q", 3)     # [2 * generation (+1 while writing), epoch, cursor]
        self._array[1], self._array[2] = int(epoch), int(cursor)
        self._local: list[int] | None = None

    def publish(self, epoch: int, cursor: int) -> int:
        """Make (epoch, cursor) the current position; returns its generation."""
        if self._array is None:
            gen = self._local[0] + 1
            self._local = [gen, int(epoch), int(cursor)]
            return gen
        a = self._array
        gen = a[0] // 2 + 1
        a[0] = 2 * gen - 1                                  # odd: a write is in progress
        a[1], a[2] = int(epoch), int(cursor)
        a[0] = 2 * gen
        return gen

    def read(self) -> tuple[int, int, int]:
        """(generation, epoch, cursor) as last published."""
        if self._array is None:
            return self._local[0], self._local[1], self._local[2]
        a = self._array
        while True:
            before = a[0]
            epoch, cursor = a[1], a[2]
            if before % 2 == 0 and a[0] == before:
                return before // 2, epoch, cursor

    @property
    def shared(self) -> bool:
        return self._array is not None

    def __getstate__(self) -> dict:
        if self._array is not None and mp_context.get_spawning_popen() is not None:
            return {"array": self._array, "local": None}     # a worker being spawned: share the memory
        return {"array": None, "local": list(self.read())}

    def __setstate__(self, state: dict) -> None:
        self._array, self._local = state["array"], state["local"]
