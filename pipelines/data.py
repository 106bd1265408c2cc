"""Batch sources for the trainer: an endless iterator of PackedBatch dicts with resumable state.

The trainer only needs `BatchSource`: iterate (across epochs, forever),
`state_dict()` (plain data: what to resume from) and `load_state_dict()`.
`DatasetSource` wraps vlmdata's `VLMDataset` + `make_loader`; `ListSource`
cycles over in-memory packs (tests that need no dataset).
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from vlmdata.decode.policy import DynamicPolicy, FixedPolicy, make_policy
from vlmdata.formats.manifest import Manifest

log = logging.getLogger(__name__)


class BatchSource(Protocol):
    def __iter__(self) -> Iterator[dict]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class DataOptions:
    """Where the packs come from and how they are made."""

    data: str                          # dataset directory or URL (has manifest.json)
    max_tokens: int = 2048
    max_images: int = 16
    image_size: int | str = 56         # an int (fixed S x S) or "dynamic"
    num_workers: int | str = 1
    decoder: str = "auto"
    cache_daemon: str | None = None    # address of a `vlmdata cache-daemon`, else direct reads
    seed: int = 0

    def policy(self) -> FixedPolicy | DynamicPolicy:
        if self.image_size == "dynamic":
            return DynamicPolicy(patch=14, merge=2, min_pixels=28 * 28, max_pixels=112 * 112)
        return make_policy(int(self.image_size))


def model_fields_for(opts: DataOptions) -> dict:
    """VLMConfig fields that must agree with the data: vocabulary, image id, patch and merge."""
    manifest = Manifest.load(opts.data)
    tok = manifest.tokenizer
    policy = opts.policy()
    return {"vocab_size": int(tok["vocab_size"]), "image_token_id": int(tok["special"]["image"]),
            "patch": policy.patch, "merge": policy.merge}


def make_cache(opts: DataOptions):
    """The `cache=` argument of VLMDataset: a daemon client config, or None for direct reads."""
    if not opts.cache_daemon:
        return None
    from vlmdata.cache import CacheConfig

    return CacheConfig(daemon=opts.cache_daemon)


class DatasetSource:
    """VLMDataset + make_loader, rolled over epochs; state = the last consumed pack's state."""

    def __init__(self, opts: DataOptions, rank: int, world_size: int, pin_memory: bool = False):
        from vlmdata import VLMDataset, make_loader

        self.opts = opts
        self.dataset = VLMDataset(opts.data, seed=opts.seed, max_tokens=opts.max_tokens,
                                  max_images=opts.max_images, image_size=opts.policy(), rank=rank,
                                  world_size=world_size, decoder=opts.decoder, cache=make_cache(opts))
        self._make_loader = make_loader
        self.pin_memory = pin_memory
        self.epoch = 0
        self.last_state: dict | None = None
        self.dataset.set_epoch(0)

    def __iter__(self) -> Iterator[dict]:
        empty_epochs = 0
        while True:
            loader = self._make_loader(self.dataset, num_workers=self.opts.num_workers, pin_memory=self.pin_memory)
            delivered = 0
            for batch in loader:
                delivered += 1
                self.last_state = batch.get("state")
                yield batch
            empty_epochs = 0 if delivered else empty_epochs + 1
            if empty_epochs > 1:
                raise RuntimeError(f"dataset {self.opts.data} yields no pack for this rank: it is too small "
                                   "for the world size and max_tokens")
            self.epoch += 1
            self.last_state = None
            self.dataset.set_epoch(self.epoch)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "dataset": self.last_state}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self.dataset.set_epoch(self.epoch)
        self.last_state = state.get("dataset")
        if self.last_state is not None:
            self.dataset.load_state_dict(self.last_state)


class ListSource:
    """Cycles over in-memory packs; state = how many were consumed."""

    def __init__(self, packs: list[dict]):
        if not packs:
            raise ValueError("ListSource needs at least one pack")
        self.packs = packs
        self.consumed = 0

    def __iter__(self) -> Iterator[dict]:
        while True:
            batch = self.packs[self.consumed % len(self.packs)]
            self.consumed += 1
            yield batch

    def state_dict(self) -> dict:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.consumed = int(state["consumed"])
