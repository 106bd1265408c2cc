"""Batch sources for the trainer: an endless iterator of PackedBatch dicts with resumable state.

The trainer only needs `BatchSource`: iterate (across epochs, forever),
`state_dict()` (plain data: what to resume from) and `load_state_dict()`.
`DatasetSource` wraps vlmdata's `VLMDataset` + `make_loader`; `ListSource`
cycles over in-memory packs (tests that need no dataset).

GPU decode: on a CUDA device with decoder "dali"/"auto" (and a WebDataset
dataset), `make_batch_source` builds the dataset with `defer_decode=True` (the
workers ship encoded JPEG bytes) and wraps it in `StagedSource`, which runs
`vlmdata.decode.dali.gpu.DaliGpuStage` (nvJPEG decode, resize, normalise, in
this process) on every pack, and for a dataset with videos `DaliVideoStage` (the sampled frames of
each clip, NVDEC). Its `pixel_values` are floating and normalised,
which the model recognises by their dtype. Elsewhere nothing changes: the
workers decode to uint8.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from vlmdata.decode import DynamicPolicy, FixedPolicy, make_policy
from vlmdata.formats import Manifest
from vlmdata_pipelines.profiling import phase

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
    max_images: int | None = None   # None: the image policy's default budget (VLMDataset)
    image_size: int | str = 56         # an int (fixed S x S) or "dynamic"
    num_workers: int | str = 1
    decoder: str = "auto"
    pixels: str | None = None          # "exact" (the model processor's pixels) | "fast"; None: vlmdata's default
    cache_daemon: str | None = None    # address of a `vlmdata cache-daemon`, else direct reads
    seed: int = 0
    decode_stage: str = "auto"         # decode in the training process: "auto" (DALI on a CUDA device when
                                       # decoder is dali/auto), "off" (always the workers), "dali-cpu" (DALI's
                                       # CPU backend in the training process: GPU-less checks of that path)
    image_policy: FixedPolicy | DynamicPolicy | None = None   # overrides image_size (a model's own policy)

    def policy(self) -> FixedPolicy | DynamicPolicy:
        if self.image_policy is not None:
            return self.image_policy
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

    def __init__(self, opts: DataOptions, rank: int, world_size: int, pin_memory: bool = False,
                 defer_decode: bool = False):
        from vlmdata.loading import DatasetOptions, VLMDataset, make_loader

        self.opts = opts
        self.dataset = VLMDataset(opts.data, seed=opts.seed, max_tokens=opts.max_tokens,
                                  max_images=opts.max_images, image_size=opts.policy(), rank=rank,
                                  world_size=world_size, decoder=opts.decoder, cache=make_cache(opts),
                                  options=DatasetOptions(defer_decode=defer_decode, pixels=opts.pixels))
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


Stage = Callable[[dict], dict]


class StagedSource:
    """A BatchSource whose packs go through `stage` in this process (e.g. DaliGpuStage: GPU decode).

    The trainer times `next()` as data wait, so the stage's time counts as data wait; each pack
    also carries it as `stage_seconds`. State is the wrapped source's (the stage holds none).
    """

    def __init__(self, source: BatchSource, stage: Stage):
        self.source, self.stage = source, stage

    def __iter__(self) -> Iterator[dict]:
        for batch in self.source:
            t = time.perf_counter()
            with phase("decode_stage"):
                batch = self.stage(batch)
            batch["stage_seconds"] = time.perf_counter() - t
            yield batch

    def state_dict(self) -> dict:
        return self.source.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.source.load_state_dict(state)


def check_normalisation(mean: tuple, std: tuple) -> None:
    """Raise unless a stage normalises (0-255 scale mean/std) exactly as the model does for uint8 pixels."""
    from vlmdata_pipelines.model import PIXEL_MEAN, PIXEL_STD

    def same(got: tuple, want: tuple) -> bool:
        return len(got) == len(want) and all(math.isclose(a, 255 * b, rel_tol=1e-6) for a, b in zip(got, want))

    if not (same(tuple(mean), PIXEL_MEAN) and same(tuple(std), PIXEL_STD)):
        raise ValueError(f"the decode stage normalises with mean {tuple(mean)} / std {tuple(std)} (0-255 scale) "
                         f"but the model expects CLIP's {tuple(255 * m for m in PIXEL_MEAN)} / "
                         f"{tuple(255 * s for s in PIXEL_STD)}")


DECODE_STAGES = ("auto", "off", "dali-cpu")


def gpu_stage_for(opts: DataOptions, device: torch.device, image_token_id: int):
    """The in-process decode stage for `opts.decode_stage`, or None (worker decode).

    "auto": a DaliGpuStage when packs can be decoded on this CUDA device (not on CPU, not with
    decoder "pillow", not for memmap datasets, which hold decoded arrays); "dali-cpu": the same
    stage on DALI's CPU backend, float32 (any device); "off": None.
    """
    if opts.decode_stage not in DECODE_STAGES:
        raise ValueError(f"unknown decode stage {opts.decode_stage!r}: use one of {', '.join(DECODE_STAGES)}")
    if opts.decode_stage == "off" or (opts.decode_stage == "auto" and device.type != "cuda"):
        return None
    if Manifest.load(opts.data).kind == "memmap":  # already-decoded arrays: nothing to decode
        return None
    if opts.decode_stage == "dali-cpu":
        from vlmdata.decode.dali import DaliGpuStage, GpuStageOptions

        stage = DaliGpuStage(opts.policy(), GpuStageOptions(device="cpu", dtype="float32",
                                                            image_token_id=image_token_id))
    else:
        from vlmdata.decode import make_gpu_stage

        stage = make_gpu_stage(opts.decoder, opts.policy(), device.index or 0, image_token_id)
    if stage is not None:
        norm = stage.options.normalize
        check_normalisation(norm.mean, norm.std)
    return stage


def staged_dataset_source(opts: DataOptions, rank: int, world_size: int, stage: Stage | None,
                          pin_memory: bool = False) -> BatchSource:
    """DatasetSource, deferring decode to `stage` when one is given."""
    source = DatasetSource(opts, rank, world_size, pin_memory=pin_memory, defer_decode=stage is not None)
    if stage is None:
        return source
    return StagedSource(source, with_video_stage(stage, source.dataset.collate_config.video_policy))


def with_video_stage(stage: Stage, video_policy) -> Stage:
    """`stage`, then (when the dataset lays out videos, whose clips defer_decode ships encoded too) a
    `DaliVideoStage` on the same DALI device."""
    if video_policy is None:
        return stage
    from vlmdata.decode.dali import DaliVideoStage, VideoStageOptions

    opt = stage.options
    videos = DaliVideoStage(video_policy, VideoStageOptions(
        device=opt.device, device_id=opt.device_id if opt.device == "mixed" else None))

    def both(batch: dict) -> dict:
        return videos(stage(batch))

    return both


def make_batch_source(opts: DataOptions, rank: int, world_size: int, device: torch.device,
                      image_token_id: int) -> BatchSource:
    """The trainer's source: GPU decode in this process when usable (see module doc), else worker decode."""
    stage = gpu_stage_for(opts, device, image_token_id)
    if stage is not None:
        log.info("rank %d: images decoded by DALI (%s) in the training process", rank, stage.options.device)
    else:
        log.info("rank %d: images decoded in the DataLoader workers (decoder=%s)", rank, opts.decoder)
    return staged_dataset_source(opts, rank, world_size, stage, pin_memory=device.type == "cuda")


# Pack fields that stay on the host: the model reads them with .tolist()/int() (a device copy would
# only add a device-to-host sync) or they are not tensors at all.
HOST_FIELDS = frozenset({"image_grid", "vision_cu_seqlens", "sample_keys", "stats", "state", "max_seqlen"})


def batch_to_device(batch: dict, device: torch.device) -> dict:
    """A shallow copy of a pack with its tensors on `device` (non-blocking from pinned memory).

    The trainer calls it just before the forward (the profiler's h2d phase); on the CPU nothing moves.
    """
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) and k not in HOST_FIELDS else v
            for k, v in batch.items()}
