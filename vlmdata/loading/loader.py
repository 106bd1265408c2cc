"""`make_loader`: a torch DataLoader set up for a VLMDataset (batch_size=None: the dataset yields packs)."""
from __future__ import annotations

from torch.utils.data import DataLoader

from vlmdata.loading.adapted import AdaptedDataset
from vlmdata.loading.dataloader import build_dataloader
from vlmdata.tune.settings import WorkerThreads, apply_decode_threads
from vlmdata.tune.tuner import auto_loader_settings

__all__ = ["make_loader"]


def make_loader(ds, num_workers: int | str = 2, pin_memory: bool | None = None,
                prefetch_factor: int | None = None, persistent_workers: bool = False,
                stateful: bool = False, adapter=None, **kwargs) -> DataLoader:
    """A DataLoader over `ds` yielding one PackedBatch per step.

    adapter: a picklable callable applied to every pack in the workers (e.g. a
    `vlmdata.hf` output adapter, which yields a Hugging Face model's forward inputs
    instead); the loader's dataset is then an `AdaptedDataset` over `ds`, and the
    tuner ("auto") still measures `ds`.
    num_workers="auto" asks `vlmdata.tune.auto_loader_settings(ds)` for workers,
    prefetch and pinning. pin_memory=None pins when CUDA is available.
    stateful=True returns torchdata's StatefulDataLoader (state_dict / load_state_dict).
    With "auto", a `worker_init_fn` of the caller runs after the tuner's (decode threads); when the
    tuner picks 0 workers, its decode threads are applied to `ds` itself.
    persistent_workers=True keeps the workers (and their caches) from one epoch to the next;
    `ds.set_epoch()` and `ds.load_state_dict()` on the main process reach them through a shared value.
    Extra keyword arguments go to the DataLoader.
    """
    if num_workers == "auto":
        settings = auto_loader_settings(ds)
        extra = settings.loader_kwargs()            # num_workers, pin_memory, prefetch, worker_init_fn
        num_workers = extra.pop("num_workers")
        if "worker_init_fn" in extra and kwargs.get("worker_init_fn") is not None:
            extra["worker_init_fn"] = WorkerThreads(settings.decode_threads, chain=kwargs.pop("worker_init_fn"))
        if num_workers == 0 and settings.decode_threads > 1:
            apply_decode_threads(ds, settings.decode_threads)
        tuned_prefetch = extra.pop("prefetch_factor", None)
        prefetch_factor = prefetch_factor if prefetch_factor is not None else tuned_prefetch
        tuned_pin = extra.pop("pin_memory", None)
        if pin_memory is None:
            pin_memory = tuned_pin
        extra.update(kwargs)
        kwargs = extra
    if adapter is not None:
        ds = AdaptedDataset(ds, adapter)
    return build_dataloader(ds, num_workers=num_workers, pin_memory=pin_memory, prefetch_factor=prefetch_factor,
                            persistent_workers=persistent_workers, stateful=stateful, **kwargs)
