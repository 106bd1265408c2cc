"""Distributed training of the tiny VLM on packed batches; run it with torchrun:

    python -m torch.distributed.run --nproc_per_node 2 -m vlmdata_pipelines.train \\
        --data /path/to/dataset --steps 40 --out /tmp/run [--fsdp] [--accum 2] \\
        [--ckpt-dir /tmp/ckpt --ckpt-every 10] [--resume] [--metrics-port 9400]

- `--model tiny|small|base`: the built-in TinyVLM; `--model hf:DIR`: a Hugging Face VLM (Qwen2-VL,
  Qwen2.5-VL, LLaVA) built from a model folder (`vlmdata_pipelines.hf_model`), fed through vlmdata's output
  adapter, with the images at the model's own image policy.
- DDP by default (gloo on CPU, NCCL on GPU); `--fsdp` shards with FSDP2 (`fully_shard`).
- bf16 autocast on GPU; fp32 on CPU.
- Gradient accumulation over `--accum` packs per step, with `no_sync` on all
  but the last. The loss is the sum of token losses divided by the GLOBAL
  number of label tokens of the step (all micro-batches, all ranks), counted
  and all-reduced before the forward passes. DDP and FSDP average gradients
  over ranks, so each rank back-propagates sum * world_size / global_count.
- A pack with no sample (an epoch tail with fewer samples than ranks) still
  runs a forward/backward with zero loss that touches every parameter, so
  every rank issues the same collectives.
- Checkpoint and resume: model, optimizer (DCP) and each rank's data state
  (the `state` of its last consumed pack). The learning rate is a pure
  function of the step, and nothing else is random, so a resumed run
  reproduces the losses of an uninterrupted one.
- Per step: real tokens/s, step time, data-wait fraction, loss (log lines,
  a JSONL file per rank under --out, and Prometheus metrics per rank).
- Communication (DDP): `--ddp-bucket-mb`, `--ddp-static-graph`, gradient-as-bucket-view (on;
  `--no-ddp-gradient-as-bucket-view`), `--comm-hook none|bf16|fp16|powersgd` with
  `--powersgd-rank` / `--powersgd-start-iter`; every hook works with `--accum` (vlmdata_pipelines.comm).
  The bytes the hook all-reduces are counted per step.
- Profiling: `--profile STEPS` records a window of steps with torch.profiler (`--profile-wait`,
  `--profile-warmup`, `--profile-repeat`), writes the trace under `--out/profile/` and logs where
  the step time went, phase by phase (vlmdata_pipelines.profiling, vlmdata_pipelines.step_breakdown).
- Telemetry: gradient norm and learning rate per step; on a GPU, NVML utilisation and memory and
  torch's allocator peak (vlmdata_pipelines.telemetry); all of it in the log, the JSONL and the metrics.
- GPU decode: on CUDA with `--decoder dali|auto`, the workers ship encoded
  images and DALI decodes them on the GPU in this process before each step
  (`vlmdata_pipelines.data.make_batch_source`); that time counts as data wait and is
  also reported as `stage_seconds`. `--decoder pillow` or `--decode-stage off`
  keeps worker decode; `--decode-stage dali-cpu` runs the same stage on DALI's
  CPU backend (to check that path without a GPU).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from vlmdata import fsutil
from vlmdata.metrics import MetricSet, StatsDelta, serve_metrics
from vlmdata_pipelines.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from vlmdata_pipelines.comm import (
    COMM_HOOKS,
    CommOptions,
    attach_comm_hook,
    ddp_kwargs,
    must_sync_every_micro_batch,
)
from vlmdata_pipelines.data import (
    BatchSource,
    DataOptions,
    batch_to_device,
    make_batch_source,
    model_fields_for,
)
from vlmdata_pipelines.hf_model import HFModelConfig, build_model, hf_data_options, is_hf_model
from vlmdata_pipelines.model import IGNORE, TinyVLM, VLMConfig, image_grids, param_checksum
from vlmdata_pipelines.profiling import ProfileOptions, StepProfiler, phase
from vlmdata_pipelines.step_breakdown import Breakdown, format_breakdown
from vlmdata_pipelines.telemetry import GpuTelemetry, gradient_norm

log = logging.getLogger("vlmdata_pipelines.train")


@dataclass
class TrainConfig:
    """Optimisation, parallelism, checkpointing and reporting options."""

    steps: int = 20
    accum: int = 1
    lr: float = 2e-3
    warmup: int = 0
    weight_decay: float = 0.0
    optimizer: str = "adamw"           # "adamw" | "sgd"
    grad_clip: float = 1.0             # 0 disables
    fsdp: bool = False
    seed: int = 0
    ckpt_dir: str | None = None
    ckpt_every: int = 0                # 0: only at the end (when ckpt_dir is set)
    resume: bool = False
    stop_after: int | None = None      # stop (and checkpoint) after this step; the schedule still uses `steps`
    out_dir: str | None = None         # per-rank steps.rank{r}.jsonl and result.rank{r}.json
    metrics_port: int | None = None    # rank r serves on port + r (0: any free port)
    log_every: int = 1
    comm: CommOptions = field(default_factory=CommOptions)          # DDP buckets and communication hook
    profile: ProfileOptions = field(default_factory=ProfileOptions)  # --profile window


@dataclass
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device


@dataclass
class StepRecord:
    """What one optimizer step did, as seen by one rank (global fields are all-reduced)."""

    step: int
    loss: float                 # global: sum of token losses / global label tokens
    label_tokens: int           # global
    real_tokens: int            # global
    images: int                 # global
    samples: int                # global
    packs: int                  # global
    step_seconds: float         # this rank
    wait_seconds: float         # this rank
    lr: float
    extra: dict = field(default_factory=dict)
    grad_norm: float = 0.0      # global, before clipping
    allreduce_bytes: int = 0    # this rank: gradient bytes the DDP hook all-reduced


def init_distributed() -> DistInfo:
    """Join the torchrun job (or make a 1-rank group when run alone)."""
    use_cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        backend = "nccl" if use_cuda else "gloo"
        if "RANK" in os.environ:
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, device)


def label_count(batch: dict) -> int:
    """Label tokens of a pack, counted as the model counts them (targets = labels[1:])."""
    labels = batch["labels"]
    return int((labels[1:] != IGNORE).sum()) if labels.numel() > 1 else 0


def image_count(batch: dict) -> int:
    """Images in a pack: the loader's count (`stats`), else one per image in its tensors: a tiled family's
    `image_tiles` entry, an [images, ...] pixel_values' first axis (LLaVA's [n, 3, S, S], the generic family's
    LLaVA-NeXT [n, patches, 3, S, S]), a Qwen pack's grid row."""
    stats = batch.get("stats")
    if isinstance(stats, dict) and "images" in stats:
        return int(stats["images"])
    pixels = batch.get("pixel_values")
    if pixels is None:
        return 0
    if "image_tiles" in batch:
        return len(batch["image_tiles"])
    return int(pixels.shape[0]) if pixels.dim() >= 4 else int(image_grids(batch).shape[0])


def sample_count(batch: dict) -> int:
    """Samples in a pack (an empty pack is one padding token and no sample key)."""
    keys = batch.get("sample_keys")
    return len(keys) if keys is not None else len(batch["cu_seqlens"]) - 1


def real_token_count(batch: dict) -> int:
    """Non-padding tokens of a pack."""
    return int(batch["cu_seqlens"][-1]) if sample_count(batch) else 0


def wrap_model(model: nn.Module, info: DistInfo, fsdp: bool, comm: CommOptions | None = None) -> nn.Module:
    """DDP (default; buckets etc. from `comm`) or FSDP2 over every transformer block plus the root."""
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        units = model.fsdp_units() if hasattr(model, "fsdp_units") else list(model.vision.blocks) + list(model.layers)
        for block in units:
            fully_shard(block)
        fully_shard(model)
        return model
    if info.world_size == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [info.local_rank] if info.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, **ddp_kwargs(comm or CommOptions()))


def _sync_context(model: nn.Module, sync: bool):
    """Gradient sync only on the last micro-batch: DDP no_sync, FSDP2 set_requires_gradient_sync."""
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    if not sync and hasattr(model, "no_sync") and not must_sync_every_micro_batch(model):
        return model.no_sync()
    return contextlib.nullcontext()


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def accumulate_gradients(model: nn.Module, micro: list[dict], global_count: int, world_size: int,
                         device: torch.device) -> torch.Tensor:
    """Forward/backward every micro-batch; gradients end up as d(global mean token loss).

    Returns this rank's summed token loss (detached).
    """
    scale = world_size / max(global_count, 1)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for i, batch in enumerate(micro):
        with phase("h2d"):
            batch = batch_to_device(batch, device)
        with _sync_context(model, sync=i == len(micro) - 1), _autocast(device):
            with phase("lm_forward"):  # the whole model call; vision_encoder and projector nest inside
                loss_sum, _ = model(batch)
            with phase("backward"):
                (loss_sum * scale).backward()
        total += loss_sum.detach().double()
    return total


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                 betas=(0.9, 0.95), foreach=False)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}: use adamw or sgd")


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up then cosine decay to 10 %; a pure function of the step (resume-exact)."""
    if cfg.warmup and step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(cfg.steps - cfg.warmup, 1)
    progress = min(max(step - cfg.warmup, 0) / span, 1.0)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def start_metrics_server(metrics: MetricSet, port: int, rank: int):
    """Serve this rank's metrics on 127.0.0.1:(port + rank), or any free port when port is 0."""
    bind = port + rank if port else 0
    server = serve_metrics(metrics, port=bind)
    return server, server.url


class Trainer:
    """One rank's training loop; the batch source and the model config are parameters."""

    def __init__(self, cfg: TrainConfig, model_cfg: VLMConfig | HFModelConfig, info: DistInfo):
        self.cfg, self.info = cfg, info
        torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP broadcasts them too)
        check_options(cfg)
        if info.world_size == 1 and not cfg.comm.is_default():
            log.warning("one rank: no gradient communication, so --comm-hook/--ddp-* have no effect")
        self.model = wrap_model(build_model(model_cfg, info.device), info, cfg.fsdp, cfg.comm)
        self.comm = attach_comm_hook(self.model, cfg.comm)  # None without DDP
        self.optimizer = make_optimizer(self.model, cfg)
        self.metrics = MetricSet()
        self.profiler = StepProfiler(cfg.profile, cfg.out_dir, info.rank, info.device, self._on_breakdown)
        self.gpu = GpuTelemetry.open(info.device)
        self.loader_stats = StatsDelta()  # the packs' own counts (samples, skips, cache tiers), summed
        self.records: list[StepRecord] = []
        self.decode_stage: str | None = None  # class name of the source's in-process decode stage, if any
        self.start_step = 0
        self.metrics_url: str | None = None
        self._server = None

    @property
    def module(self) -> TinyVLM:
        return getattr(self.model, "module", self.model)

    def restore(self, source: BatchSource) -> None:
        """Resume from the newest checkpoint in ckpt_dir, if any."""
        if not (self.cfg.resume and self.cfg.ckpt_dir):
            return
        path = latest_checkpoint(self.cfg.ckpt_dir)
        if path is None:
            log.info("no checkpoint in %s: starting from scratch", self.cfg.ckpt_dir)
            return
        state = load_checkpoint(path, self.model, self.optimizer)
        source.load_state_dict(state["data"])
        self.start_step = state["step"]
        log.info("rank %d resumed from %s at step %d", self.info.rank, path, self.start_step)

    def run(self, source: BatchSource) -> dict:
        cfg, info = self.cfg, self.info
        stage = getattr(source, "stage", None)
        self.decode_stage = type(stage).__name__ if stage is not None else None
        self.restore(source)
        if cfg.metrics_port is not None:
            self._server, self.metrics_url = start_metrics_server(self.metrics, cfg.metrics_port, info.rank)
        steps_file = self._open_steps_file()
        end = cfg.steps if cfg.stop_after is None else min(cfg.steps, cfg.stop_after)
        if info.rank == 0:
            log.info("%s; %s", self.gpu.describe(),
                     cfg.comm.describe() if self.comm else "no gradient all-reduce hook (FSDP or one rank)")
        it = iter(source)
        self.profiler.start(self.module)
        try:
            for step in range(self.start_step, end):
                record = self.train_step(step, it)
                self.records.append(record)
                self.profiler.step()
                if steps_file:
                    steps_file.write(json.dumps(asdict(record)) + "\n")
                    steps_file.flush()
                if info.rank == 0 and (step % cfg.log_every == 0 or step == end - 1):
                    log.info(format_record(record, info.world_size))
                last = step == end - 1
                if cfg.ckpt_dir and ((cfg.ckpt_every and (step + 1) % cfg.ckpt_every == 0) or last):
                    save_checkpoint(cfg.ckpt_dir, step + 1, self.model, self.optimizer, source.state_dict(),
                                    extra={"loss": record.loss})
        finally:
            self.profiler.stop()
            if steps_file:
                steps_file.close()
            close = getattr(it, "close", None)
            if close:
                close()
        result = self.summary()
        if cfg.out_dir:
            path = os.path.join(cfg.out_dir, f"result.rank{info.rank}.json")
            fsutil.atomic_write_bytes(path, json.dumps(result, indent=1).encode())
        return result

    def _open_steps_file(self):
        if not self.cfg.out_dir:
            return None
        os.makedirs(self.cfg.out_dir, exist_ok=True)
        return open(os.path.join(self.cfg.out_dir, f"steps.rank{self.info.rank}.jsonl"), "a")

    def train_step(self, step: int, it: Iterator[dict]) -> StepRecord:
        info, cfg = self.info, self.cfg
        t0 = time.perf_counter()
        self.profiler.begin_step(step)
        micro, wait, stage = [], 0.0, 0.0
        for _ in range(cfg.accum):
            t = time.perf_counter()
            with phase("data_wait"):
                batch = next(it)
            wait += time.perf_counter() - t
            stage += batch.pop("stage_seconds", 0.0)  # in-process decode: part of the wait
            micro.append(batch)
            if batch.get("stats"):
                delta = StatsDelta.from_dict(batch["stats"])
                self.metrics.absorb(delta, info.rank)
                self.loader_stats.merge(delta)
        local = torch.tensor([sum(label_count(b) for b in micro)], dtype=torch.int64, device=info.device)
        dist.all_reduce(local)
        global_count = int(local.item())
        lr = lr_at(cfg, step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss_sum = accumulate_gradients(self.model, micro, global_count, info.world_size, info.device)
        with phase("optimizer"):
            grad_norm = gradient_norm(self.model, cfg.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        if info.device.type == "cuda":
            torch.cuda.synchronize(info.device)  # the step's kernels belong to this step's time
        elapsed = time.perf_counter() - t0
        self.profiler.end_step(step, elapsed)
        health = self._observe_health(float(grad_norm), lr)
        self.metrics.observe_wait(wait, info.rank)
        self.metrics.observe_step(elapsed, info.rank)
        real = sum(real_token_count(b) for b in micro)
        vec = torch.tensor([float(loss_sum), real, sum(image_count(b) for b in micro),
                            sum(sample_count(b) for b in micro), len(micro)],
                           dtype=torch.float64, device=info.device)
        dist.all_reduce(vec)
        loss_g, real_g, images_g, samples_g, packs_g = vec.tolist()
        return StepRecord(step=step, loss=loss_g / max(global_count, 1), label_tokens=global_count,
                          real_tokens=int(real_g), images=int(images_g), samples=int(samples_g), packs=int(packs_g),
                          step_seconds=elapsed, wait_seconds=wait, lr=lr,
                          extra={"local_real_tokens": real, "local_loss_sum": float(loss_sum),
                                 "stage_seconds": stage, **health["extra"]},
                          grad_norm=health["grad_norm"], allreduce_bytes=health["allreduce_bytes"])

    def _observe_health(self, grad_norm: float, lr: float) -> dict:
        """After the timed step: gradient norm, learning rate, all-reduced bytes, GPU reading -> metrics."""
        rank = self.info.rank
        self.metrics.observe_optimizer(grad_norm, lr, rank)
        nbytes = self.comm.take() if self.comm else 0
        self.metrics.observe_allreduce(nbytes, rank)
        extra = {}
        sample = self.gpu.sample()
        if sample is not None:
            self.metrics.observe_gpu(sample.to_dict(), rank)
            extra["gpu"] = sample.to_dict()
        return {"grad_norm": grad_norm, "allreduce_bytes": nbytes, "extra": extra}

    def _on_breakdown(self, b: Breakdown) -> None:
        """A profiling window ended: log its breakdown (rank 0), count it in the metrics, keep it."""
        self.metrics.observe_phases(b.phase_seconds, self.info.rank)
        if self.cfg.out_dir:
            path = os.path.join(self.cfg.out_dir, "profile", f"breakdown.rank{self.info.rank}.jsonl")
            with open(path, "a") as f:
                f.write(json.dumps(b.to_dict()) + "\n")
        if self.info.rank == 0:
            log.info("%s", format_breakdown(b))

    def summary(self) -> dict:
        """This rank's totals; throughput excludes the first step (loader start-up, warm-up)."""
        steady = self.records[1:] or self.records
        seconds = sum(r.step_seconds for r in steady)
        wait = sum(r.wait_seconds for r in steady)
        real = sum(r.real_tokens for r in steady)
        images = sum(r.images for r in steady)
        return {
            "rank": self.info.rank, "world_size": self.info.world_size, "device": str(self.info.device),
            "fsdp": self.cfg.fsdp, "start_step": self.start_step,
            "steps": [r.step for r in self.records], "losses": [r.loss for r in self.records],
            "checksum": param_checksum(self.module), "metrics_url": self.metrics_url,
            "params": sum(p.numel() for p in self.module.parameters()),
            "steady_steps": len(steady), "seconds": seconds, "wait_seconds": wait,
            "data_wait_fraction": wait / seconds if seconds else 0.0,
            "decode_stage": self.decode_stage,
            "stage_seconds": sum(r.extra.get("stage_seconds", 0.0) for r in steady),
            "real_tokens": real, "images": images, "packs": sum(r.packs for r in steady),
            "samples": sum(r.samples for r in steady),
            "tokens_per_second": real / seconds if seconds else 0.0,
            "images_per_second": images / seconds if seconds else 0.0,
            "total_real_tokens": sum(r.real_tokens for r in self.records),
            "total_packs": sum(r.packs for r in self.records),
            "loader_stats": self.loader_stats.to_dict(),
            "grad_norms": [r.grad_norm for r in self.records],
            "comm": self._comm_summary(),
            "gpu_telemetry": self.gpu.summary(),
            "profile": [b.to_dict() for b in self.profiler.breakdowns],
        }

    def _comm_summary(self) -> dict:
        per_step = [r.allreduce_bytes for r in self.records]
        return {"hook": self.cfg.comm.hook if self.comm else None, "options": asdict(self.cfg.comm),
                "allreduce_bytes_per_step": per_step,
                "mean_allreduce_bytes": sum(per_step) / len(per_step) if per_step else 0.0}

    def close(self) -> None:
        self.gpu.close()
        if self._server is not None:
            self._server.close() if hasattr(self._server, "close") else self._server.shutdown()


def format_record(r: StepRecord, world: int) -> str:
    tps = r.real_tokens / r.step_seconds if r.step_seconds else 0.0
    frac = r.wait_seconds / r.step_seconds if r.step_seconds else 0.0
    gpu = r.extra.get("gpu")
    if gpu and gpu.get("memory_used") is not None:
        gpu_text = (f" gpu {100 * gpu['utilization']:.0f}% mem {gpu['memory_used'] / 2**30:.1f}/"
                    f"{gpu['memory_total'] / 2**30:.0f} GiB")
    elif gpu:
        gpu_text = f" gpu max-allocated {gpu['max_allocated'] / 2**30:.1f} GiB"
    else:
        gpu_text = ""
    return (f"step {r.step + 1} loss {r.loss:.4f} tokens/s {tps:,.0f} ({world} ranks) "
            f"step {r.step_seconds * 1000:.0f} ms data-wait {100 * frac:.1f}% lr {r.lr:.2e} "
            f"grad-norm {r.grad_norm:.3f}{gpu_text}")


def check_options(cfg: TrainConfig) -> None:
    """Raise ValueError, saying what to change, for communication and profiling options that cannot work."""
    cfg.comm.validate()
    cfg.profile.validate()
    if cfg.fsdp and not cfg.comm.is_default():
        raise ValueError("--comm-hook, --ddp-* and --powersgd-* tune DDP; FSDP2 (--fsdp) does not use them: "
                         "drop them or drop --fsdp")
    if cfg.profile.enabled and not cfg.out_dir:
        raise ValueError("--profile writes a trace: give --out DIR as well")


SourceFactory = Callable[[DistInfo], BatchSource]


def train(cfg: TrainConfig, model_cfg: VLMConfig, make_source: SourceFactory) -> dict:
    """Run training on this rank (joining/creating the process group); returns the rank's summary."""
    info = init_distributed()
    trainer = Trainer(cfg, model_cfg, info)
    try:
        return trainer.run(make_source(info))
    finally:
        trainer.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vlmdata_pipelines.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="dataset directory or URL (with manifest.json)")
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--max-images", type=int, default=None,
                   help="images per pack at most (default: the image policy's budget: 16 for fixed-size images, "
                        "a vision-patch budget and no image cap for Qwen2-VL-style dynamic resolution)")
    p.add_argument("--image-size", default="56", help="fixed image side (multiple of 14) or 'dynamic'")
    p.add_argument("--num-workers", default="1", help="DataLoader workers per rank, or 'auto'")
    p.add_argument("--decoder", default="auto", help="pillow | dali | auto")
    p.add_argument("--pixels", default=None, choices=("exact", "fast"),
                   help="exact: the model's image processor's pixels, bit for bit (default for a dataset sharded "
                        "with a model folder and decoded in the workers); fast: draft decode + bilinear")
    p.add_argument("--decode-stage", default="auto", choices=("auto", "off", "dali-cpu"),
                   help="decode in the training process: auto = DALI on the GPU when there is one and the "
                        "decoder is dali/auto; off = always in the workers; dali-cpu = DALI's CPU backend "
                        "in the training process (checks that path without a GPU)")
    p.add_argument("--cache-daemon", default=None, help="address of a vlmdata cache-daemon")
    p.add_argument("--model", default="tiny", type=_model_arg,
                   help="tiny | small | base (the built-in TinyVLM), or hf:DIR: a Hugging Face VLM (Qwen2-VL, "
                        "Qwen2.5-VL, LLaVA) from a model folder, randomly initialised unless it holds weights; "
                        "images then follow the model's processor (--image-size is ignored)")
    p.add_argument("--attn-backend", default="auto", choices=("auto", "flash", "torch", "reference"),
                   help="varlen attention backend; for hf:DIR models: auto, flash (flash_attention_2), torch "
                        "(vlmdata_varlen) or reference (sdpa with a block-diagonal mask)")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd"))
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--fsdp", action="store_true", help="shard with FSDP2 instead of DDP")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--stop-after", type=int, default=None)
    p.add_argument("--out", default=None, help="directory for per-rank step logs and results")
    p.add_argument("--metrics-port", type=int, default=None)
    p.add_argument("--log-every", type=int, default=1)
    g = p.add_argument_group("DDP communication (vlmdata_pipelines.comm)")
    g.add_argument("--comm-hook", default="none", choices=COMM_HOOKS,
                   help="gradient all-reduce: none (fp32), bf16/fp16 (half the bytes), powersgd (low rank)")
    g.add_argument("--powersgd-rank", type=int, default=2, help="PowerSGD matrix approximation rank")
    g.add_argument("--powersgd-start-iter", type=int, default=10,
                   help="optimizer steps of plain all-reduce before PowerSGD compresses (>= 2)")
    g.add_argument("--ddp-bucket-mb", type=float, default=25.0, help="DDP gradient bucket size (MB)")
    g.add_argument("--ddp-static-graph", action="store_true", help="tell DDP the graph is the same every step")
    g.add_argument("--ddp-gradient-as-bucket-view", action=argparse.BooleanOptionalAction, default=True,
                   help="gradients are views into DDP's buckets (saves a copy and memory)")
    g = p.add_argument_group("profiling (vlmdata_pipelines.profiling)")
    g.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="record STEPS steps with torch.profiler; trace and breakdown under --out/profile/")
    g.add_argument("--profile-wait", type=int, default=1, help="steps skipped before the warm-up")
    g.add_argument("--profile-warmup", type=int, default=1, help="profiled steps discarded (profiler start-up)")
    g.add_argument("--profile-repeat", type=int, default=1, help="profiling windows; 0: until the run ends")
    return p


def _model_arg(value: str) -> str:
    if value in ("tiny", "small", "base") or (is_hf_model(value) and len(value) > 3):
        return value
    raise argparse.ArgumentTypeError(f"{value!r}: use tiny, small, base or hf:DIR")


def configs_from_args(args: argparse.Namespace) -> tuple[TrainConfig, VLMConfig | HFModelConfig, DataOptions]:
    workers = args.num_workers if args.num_workers == "auto" else int(args.num_workers)
    size = args.image_size if args.image_size == "dynamic" else int(args.image_size)
    data = DataOptions(data=args.data, max_tokens=args.max_tokens, max_images=args.max_images, image_size=size,
                       num_workers=workers, decoder=args.decoder, pixels=args.pixels, cache_daemon=args.cache_daemon,
                       seed=args.seed, decode_stage=args.decode_stage)
    if is_hf_model(args.model):
        model_cfg = HFModelConfig.from_arg(args.model, args.attn_backend, args.activation_checkpointing)
        data = hf_data_options(data, model_cfg)
    else:
        model_cfg = VLMConfig.preset(args.model, attn_backend=args.attn_backend,
                                     activation_checkpointing=args.activation_checkpointing, **model_fields_for(data))
    cfg = TrainConfig(steps=args.steps, accum=args.accum, lr=args.lr, warmup=args.warmup,
                      optimizer=args.optimizer, grad_clip=args.grad_clip, fsdp=args.fsdp, seed=args.seed,
                      ckpt_dir=args.ckpt_dir, ckpt_every=args.ckpt_every, resume=args.resume,
                      stop_after=args.stop_after, out_dir=args.out, metrics_port=args.metrics_port,
                      log_every=args.log_every,
                      comm=CommOptions(hook=args.comm_hook, bucket_mb=args.ddp_bucket_mb,
                                       static_graph=args.ddp_static_graph,
                                       gradient_as_bucket_view=args.ddp_gradient_as_bucket_view,
                                       powersgd_rank=args.powersgd_rank,
                                       powersgd_start_iter=args.powersgd_start_iter),
                      profile=ProfileOptions(steps=args.profile, wait=args.profile_wait, warmup=args.profile_warmup,
                                             repeat=args.profile_repeat))
    check_options(cfg)
    return cfg, model_cfg, data


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg, model_cfg, data = configs_from_args(args)

    def make_source(info: DistInfo) -> BatchSource:
        return make_batch_source(data, info.rank, info.world_size, info.device, model_cfg.image_token_id)

    try:
        result = train(cfg, model_cfg, make_source)
        if result["rank"] == 0:
            log.info("done: %d steps, %.0f real tokens/s per rank, data-wait %.1f%%, decode: %s",
                     len(result["steps"]), result["tokens_per_second"] / max(result["world_size"], 1),
                     100 * result["data_wait_fraction"],
                     "in-process " + result["decode_stage"] if result["decode_stage"] else "DataLoader workers")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
