"""A dataset repeated without end, so that a tuning measurement runs as long as it must.

A measurement that stops because the dataset ended measures start-up and the last, ragged
packs, not the steady state (the tuner once chose from 0.5 s runs ending that way).
`LoopedDataset(ds)` iterates a fresh shallow copy of `ds` per pass, each on the next epoch
(`set_epoch`) when the dataset has epochs, so a VLMDataset plans new packs and is never iterated
twice in one worker; the copies do not log their truncated samples (`log_lengths`: a measurement pass
is not a training epoch). Decode-thread settings are passed through to the wrapped dataset.
"""
from __future__ import annotations

import copy

from torch.utils.data import IterableDataset

__all__ = ["LoopedDataset"]


class LoopedDataset(IterableDataset):
    """Yields `dataset`'s items over and over (stops only if a pass yields nothing)."""

    def __init__(self, dataset):
        super().__init__()
        self.dataset = dataset

    @property
    def decode_threads(self) -> int:
        return int(getattr(self.dataset, "decode_threads", 1))

    def set_decode_threads(self, threads: int) -> None:
        if hasattr(self.dataset, "set_decode_threads"):
            self.dataset.set_decode_threads(threads)

    def __iter__(self):
        epoch = getattr(self.dataset, "epoch", None)
        passes = 0
        while True:
            ds = copy.copy(self.dataset)
            if hasattr(ds, "log_lengths"):
                ds.log_lengths = False
            if epoch is not None and hasattr(ds, "set_epoch"):
                ds.set_epoch(epoch + passes)
            got = False
            for item in ds:
                got = True
                yield item
            if not got:
                return
            passes += 1
