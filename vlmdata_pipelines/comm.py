"""Gradient communication for DDP: bucket size, static graph, gradient-as-bucket-view and a
communication hook, wrapped so that every byte it all-reduces is counted.

Hooks (`--comm-hook`):

- "none": plain all-reduce of each fp32 gradient bucket (what DDP does by default; it runs as
  the Python `allreduce_hook` so that the counter sees it);
- "bf16" / "fp16": each bucket is cast to half precision, all-reduced, and cast back (half the
  bytes; fp16 keeps more mantissa, bf16 more range);
- "powersgd": PowerSGD low-rank compression (rank `powersgd_rank`) with error feedback and warm
  start; the first `powersgd_start_iter` optimizer steps run plain all-reduce (the warm-up: DDP
  also rebuilds its buckets after the first step, so the start must be at least 2).

Gradient accumulation keeps working with every hook: under `no_sync` DDP calls no hook and the
gradients accumulate in the buckets; the hook runs once, on the last micro-batch, over the sum.
PowerSGD counts its iterations in hook calls, i.e. in optimizer steps.

PowerSGD issues its second and third all-reduce (the P and Q factors) from future callbacks. On
gloo those run on the backend's worker threads as the previous collective completes, so with
several buckets two ranks can issue them in different orders and gloo fails ("collective
mismatch"). On gloo the hook therefore lets one bucket's chain finish before the next bucket
starts (the autograd thread waits); NCCL runs the callbacks in issue order and needs no wait.

Counted bytes are the payload each rank hands to all-reduce (the algorithm moves about
2 (n-1)/n times that per rank in a ring). For PowerSGD they are taken from the hook's own
bookkeeping (`PowerSGDState.compression_stats()`: the elements of the P and Q factors plus the
tensors it leaves uncompressed), and the full bucket during the warm-up.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["COMM_HOOKS", "CommCounter", "CommOptions", "attach_comm_hook", "ddp_kwargs", "must_sync_every_micro_batch",
           "register_comm_hook", "wrap_ddp"]

COMM_HOOKS = ("none", "bf16", "fp16", "powersgd")


@dataclass(frozen=True)
class CommOptions:
    """DDP's gradient-communication settings (`--comm-hook`, `--ddp-*`, `--powersgd-*`)."""

    hook: str = "none"
    bucket_mb: float = 25.0               # DDP's bucket_cap_mb (its default is 25)
    static_graph: bool = False
    gradient_as_bucket_view: bool = True  # gradients are views into the buckets: no copy, less memory
    powersgd_rank: int = 2
    powersgd_start_iter: int = 10         # optimizer steps of plain all-reduce before compressing

    def validate(self) -> None:
        """Raise ValueError naming the option to change."""
        if self.hook not in COMM_HOOKS:
            raise ValueError(f"unknown --comm-hook {self.hook!r}: use one of {', '.join(COMM_HOOKS)}")
        if not self.bucket_mb > 0:
            raise ValueError(f"--ddp-bucket-mb must be > 0, got {self.bucket_mb}")
        if self.powersgd_rank < 1:
            raise ValueError(f"--powersgd-rank must be >= 1, got {self.powersgd_rank}")
        if self.hook == "powersgd" and self.powersgd_start_iter < 2:
            raise ValueError(f"--powersgd-start-iter must be >= 2, got {self.powersgd_start_iter}: DDP rebuilds "
                             "its buckets after the first step, and PowerSGD's error feedback keeps per-bucket "
                             "state, so it can only start compressing from the third step")

    def is_default(self) -> bool:
        """True when nothing DDP-specific was asked for (FSDP runs accept only this)."""
        return self == CommOptions()

    def describe(self) -> str:
        hook = self.hook
        if hook == "powersgd":
            hook += f" (rank {self.powersgd_rank}, from step {self.powersgd_start_iter + 1})"
        return (f"comm hook {hook}, buckets {self.bucket_mb:g} MB, static graph {self.static_graph}, "
                f"gradient as bucket view {self.gradient_as_bucket_view}")


class CommCounter:
    """Bytes all-reduced by this rank's gradient hook: since the last `take()`, and in total."""

    def __init__(self, hook: str):
        self.hook = hook
        self.total_bytes = 0
        self.calls = 0
        self._pending = 0
        self._lock = threading.Lock()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self._pending += nbytes
            self.total_bytes += nbytes
            self.calls += 1

    def take(self) -> int:
        """Bytes counted since the previous call (one optimizer step's worth when called once per step)."""
        with self._lock:
            nbytes, self._pending = self._pending, 0
        return nbytes


def ddp_kwargs(opts: CommOptions) -> dict:
    """DistributedDataParallel keyword arguments for `opts` (buckets, static graph, bucket views)."""
    opts.validate()
    return {"bucket_cap_mb": opts.bucket_mb, "static_graph": opts.static_graph,
            "gradient_as_bucket_view": opts.gradient_as_bucket_view}


def attach_comm_hook(model: nn.Module, opts: CommOptions) -> CommCounter | None:
    """Register `opts.hook` when `model` is DDP; None for anything else (FSDP2, a bare module)."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return None
    return register_comm_hook(model, opts, model.process_group)


def wrap_ddp(model: nn.Module, device_ids: list[int] | None, opts: CommOptions,
             process_group=None) -> tuple[nn.Module, CommCounter]:
    """DDP with `opts`' buckets, static graph and bucket views, and its counting hook registered."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model, device_ids=device_ids, process_group=process_group, **ddp_kwargs(opts))
    return ddp, register_comm_hook(ddp, opts, process_group)


HookFn = Callable[[object, dist.GradBucket], torch.futures.Future]


def _bucket_bytes(bucket: dist.GradBucket, itemsize: int | None = None) -> int:
    buffer = bucket.buffer()
    return buffer.numel() * (itemsize or buffer.element_size())


def register_comm_hook(ddp: nn.Module, opts: CommOptions, process_group=None) -> CommCounter:
    """Register `opts.hook` on a DistributedDataParallel model, counting the bytes it all-reduces."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    opts.validate()
    counter = CommCounter(opts.hook)
    if opts.hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=process_group,
                                            matrix_approximation_rank=opts.powersgd_rank,
                                            start_powerSGD_iter=opts.powersgd_start_iter,
                                            use_error_feedback=True, warm_start=True)

        serialise = dist.get_backend(process_group) == "gloo"
        previous: list[torch.futures.Future] = []

        def hook(state, bucket):  # unannotated: DDP checks annotations, and they are strings here
            if serialise and previous:
                previous.pop().wait()
            warming_up = state.iter < state.start_powerSGD_iter
            before = state.compression_stats()[2]
            fut = powerSGD_hook.powerSGD_hook(state, bucket)
            if serialise:
                previous.append(fut)
            if warming_up:
                counter.add(_bucket_bytes(bucket))
            else:  # the P and Q factors plus the uncompressed tensors, as the hook itself tallied them
                counter.add((state.compression_stats()[2] - before) * bucket.buffer().element_size())
            return fut

        ddp.register_comm_hook(state, hook)
        return counter

    inner: HookFn
    itemsize: int | None
    if opts.hook == "none":
        inner, itemsize = default_hooks.allreduce_hook, None
    elif opts.hook == "bf16":
        inner, itemsize = default_hooks.bf16_compress_hook, 2
    else:
        inner, itemsize = default_hooks.fp16_compress_hook, 2

    def counting_hook(state, bucket):  # unannotated, see above
        counter.add(_bucket_bytes(bucket, itemsize))
        return inner(state, bucket)

    ddp.register_comm_hook(process_group, counting_hook)
    return counter


def must_sync_every_micro_batch(model: nn.Module) -> bool:
    """True while a static-graph DDP model has not finished its first synchronised backward.

    torch 2.13's DDP records the static graph during the first backward and fails an internal
    assert when that backward runs under `no_sync` (pytorch/pytorch#143580, fix in review as
    #187732). Until then every micro-batch synchronises: one extra all-reduce in the first step,
    the same gradients (the average of the sums equals the sum of the averages).
    """
    if not getattr(model, "static_graph", False):
        return False
    # DDP's own flag, set when that first backward is queued (private: absent means "not needed")
    return not getattr(model, "_static_graph_delay_allreduce_enqueued", True)
