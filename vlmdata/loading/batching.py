"""A pack is already a batch: torch's default batching of packs is refused with a clear error.

`DataLoader(ds)` batches with batch_size=1 by default: it would hand `default_collate` a list
of packs, which fails deep inside on the first None field. `default_collate` looks the type of
the batch's first element up in `torch.utils.data._utils.collate.default_collate_fn_map` before
anything else, so `PackedBatch` is registered there with a function that raises `BatchingError`
naming the fix. Raised in a DataLoader worker, the error reaches the main process as one line
(see `errors.BatchingError`). A DataLoader with `batch_size=None` (and `make_loader`) never calls
`default_collate`: it hands each pack through.
"""
from __future__ import annotations

from torch.utils.data._utils.collate import default_collate_fn_map

from vlmdata.errors import BatchingError
from vlmdata.loading.shared_pack import PackedBatch

__all__ = ["refuse_batching"]


def refuse_batching(batch, *, collate_fn_map=None):
    """`default_collate`'s function for PackedBatch: always a BatchingError."""
    raise BatchingError(f"a VLMDataset yields whole packs (each already a batch), but the DataLoader batched "
                        f"{len(batch)} of them: use DataLoader(ds, batch_size=None) or vlmdata.loading.make_loader(ds)")


default_collate_fn_map[PackedBatch] = refuse_batching
