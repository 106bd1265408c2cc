"""A pack-yielding dataset whose packs go through an adapter in the DataLoader workers.

`make_loader(ds, adapter=...)` wraps `ds` in `AdaptedDataset`, so the
adapter's per-pack work (for `vlmdata.hf` adapters: reshaping, M-RoPE
positions, boundaries) runs in the workers, in parallel with training, and the
training process receives what the model takes. Everything else is the wrapped
dataset's: epochs, resume state, decode threads, the tuning fingerprint, and
the number of packs of an epoch (`len()`, which trainers use to count steps).

The adapter is any picklable callable `pack -> dict`; it goes to every worker
with the dataset.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from torch.utils.data import IterableDataset

__all__ = ["AdaptedDataset"]


class AdaptedDataset(IterableDataset):
    """`dataset`'s packs, each passed through `adapter` where it is produced."""

    def __init__(self, dataset, adapter: Callable[[dict], dict]):
        super().__init__()
        if isinstance(dataset, AdaptedDataset):
            raise ValueError("the dataset already has an adapter: pass the underlying dataset")
        self.dataset = dataset
        self.adapter = adapter

    def __iter__(self) -> Iterator[dict]:
        for pack in self.dataset:
            yield self.adapter(pack)

    def __len__(self) -> int:
        """The wrapped dataset's `len()`: for a VLMDataset the packs this rank yields in the selected epoch."""
        if not hasattr(self.dataset, "num_steps"):        # not a pack-yielding dataset: its len is not packs
            raise TypeError(f"{type(self.dataset).__name__} does not know its number of packs")
        return len(self.dataset)

    def __bool__(self) -> bool:
        return True

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.dataset.epoch

    def state_dict(self) -> dict:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)

    @property
    def decode_threads(self) -> int:
        return self.dataset.decode_threads

    def set_decode_threads(self, threads: int) -> None:
        self.dataset.set_decode_threads(threads)

    def tune_fingerprint(self) -> dict:
        fp = dict(self.dataset.tune_fingerprint())
        describe = getattr(self.adapter, "fingerprint", None)
        fp["adapter"] = describe() if describe else type(self.adapter).__qualname__
        return fp
