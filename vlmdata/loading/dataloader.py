"""Building the torch DataLoader for a pack-yielding dataset: the one place both `make_loader` and the tuner use."""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader

__all__ = ["build_dataloader", "keep_batch"]


def keep_batch(batch):
    """Packs are already batches: hand them through unchanged (the DataLoader's collate_fn)."""
    return batch


def build_dataloader(ds, num_workers: int = 2, pin_memory: bool | None = None,
                     prefetch_factor: int | None = None, persistent_workers: bool = False,
                     stateful: bool = False, **kwargs) -> DataLoader:
    """A DataLoader over `ds` with batch_size=None (the dataset yields batches).

    pin_memory=None pins when CUDA is available; stateful=True returns torchdata's
    StatefulDataLoader. Extra keyword arguments go to the DataLoader.
    """
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an int >= 0 or 'auto', got {num_workers!r}")
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    args = dict(batch_size=None, num_workers=num_workers, pin_memory=bool(pin_memory), collate_fn=keep_batch,
                **kwargs)
    if num_workers > 0:
        args["prefetch_factor"] = prefetch_factor if prefetch_factor is not None else 2
        args["persistent_workers"] = persistent_workers
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(ds, **args)
    return DataLoader(ds, **args)
