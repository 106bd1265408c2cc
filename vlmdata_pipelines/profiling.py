"""Profiling a window of training steps with torch.profiler (`vlmdata_pipelines.train --profile STEPS`).

- `phase(name)`: a `record_function` range `vlmdata.<name>` on the training thread. The trainer
  marks data_wait, h2d, lm_forward (the whole model call), backward and optimizer; the decode
  stage marks decode_stage; `StepProfiler` adds vision_encoder and projector ranges with forward
  hooks on the model's vision tower and projector (found by name, see `phase_modules`), so they
  nest inside lm_forward. Outside a profiling window a range costs a few microseconds.
- `StepProfiler`: torch.profiler with a wait/warmup/active schedule (`ProfileOptions`). At the end of
  each active window it writes the trace (Chrome trace format, which TensorBoard's profiler plugin
  and Perfetto open) to `<out>/profile/rank<r>.steps<a>-<b>.pt.trace.json` (steps numbered from 1,
  as in the log), turns the window's events
  into a `step_breakdown.Breakdown` (seconds per phase that add up to the step time) and hands
  it to the trainer, which logs it and adds it to `vlmdata_train_phase_seconds_total{phase}`.
"""
from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd.profiler import record_function

from vlmdata_pipelines.step_breakdown import (
    ANNOTATED,
    ANNOTATION_PREFIX,
    STEP_PREFIX,
    Breakdown,
    breakdown_from_events,
    profiler_events,
)

__all__ = ["ProfileOptions", "StepProfiler", "phase", "phase_modules"]

log = logging.getLogger(__name__)

# attribute names of the vision tower and the projector: this repo's TinyVLM, then Hugging Face VLMs
VISION_NAMES = ("vision", "visual", "vision_tower", "vision_model")
PROJECTOR_NAMES = ("projector", "multi_modal_projector", "mm_projector", "merger")


def phase(name: str) -> contextlib.AbstractContextManager:
    """Mark a phase of the step for the profiler (a `vlmdata.<name>` range)."""
    if name not in ANNOTATED:
        raise ValueError(f"unknown phase {name!r}: one of {', '.join(ANNOTATED)}")
    return record_function(ANNOTATION_PREFIX + name)


@dataclass(frozen=True)
class ProfileOptions:
    """`--profile STEPS` and its schedule: skip `wait` steps, warm up `warmup`, record `steps`."""

    steps: int = 0          # active steps per window; 0: no profiling
    wait: int = 1           # the first step after a start also pays for loader start-up
    warmup: int = 1         # the profiler runs but discards (its own start-up cost)
    repeat: int = 1         # windows; 0: one window after another until the run ends

    @property
    def enabled(self) -> bool:
        return self.steps > 0

    def validate(self) -> None:
        for name in ("steps", "wait", "warmup", "repeat"):
            if getattr(self, name) < 0:
                raise ValueError(f"--profile{'' if name == 'steps' else '-' + name} must be >= 0, "
                                 f"got {getattr(self, name)}")

    def window(self) -> int:
        return self.wait + self.warmup + self.steps


def phase_modules(model: nn.Module) -> dict[str, nn.Module]:
    """{"vision_encoder": module, "projector": module} as far as the model has them, by attribute name.

    The shallowest module whose attribute name matches wins (`vision` of TinyVLM, `visual` of
    Qwen2-VL, `vision_tower` / `multi_modal_projector` of LLaVA). A projector nested inside the
    vision tower (Qwen2-VL's `merger`) is found too: its range nests inside vision_encoder's.
    """
    found: dict[str, tuple[int, nn.Module]] = {}
    for name, module in model.named_modules():
        if not name:
            continue
        leaf, depth = name.rsplit(".", 1)[-1], name.count(".")
        for key, names in (("vision_encoder", VISION_NAMES), ("projector", PROJECTOR_NAMES)):
            if leaf in names and (key not in found or depth < found[key][0]):
                found[key] = (depth, module)
    return {key: module for key, (_, module) in found.items()}


class _RangeHooks:
    """Forward pre/post hooks that open and close a `vlmdata.<phase>` range around a module's forward."""

    def __init__(self, modules: dict[str, nn.Module]):
        self._open: list[record_function] = []
        self.handles = []
        for name, module in modules.items():
            self.handles.append(module.register_forward_pre_hook(self._enter(name)))
            self.handles.append(module.register_forward_hook(self._exit))

    def _enter(self, name: str) -> Callable:
        def hook(module, args):
            rf = record_function(ANNOTATION_PREFIX + name)
            rf.__enter__()
            self._open.append(rf)
        return hook

    def _exit(self, module, args, output) -> None:
        if self._open:
            self._open.pop().__exit__(None, None, None)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        while self._open:  # a forward that raised left its range open
            self._open.pop().__exit__(None, None, None)


class StepProfiler:
    """Drives torch.profiler over the trainer's steps; does nothing when `opts.steps` is 0.

    The trainer calls `start(model)` before its loop, `begin_step(n)` / `end_step(n, seconds)`
    around each timed step, `step()` after it, and `stop()` at the end.
    """

    def __init__(self, opts: ProfileOptions, out_dir: str | None, rank: int, device: torch.device,
                 on_breakdown: Callable[[Breakdown], None]):
        opts.validate()
        if opts.enabled and not out_dir:
            raise ValueError("--profile writes a trace: give --out DIR as well")
        self.opts, self.rank, self.device = opts, rank, device
        self.trace_dir = os.path.join(out_dir, "profile") if out_dir else None
        self.on_breakdown = on_breakdown
        self.breakdowns: list[Breakdown] = []
        self.windows = 0
        self._measured: dict[int, float] = {}
        self._step_range: record_function | None = None
        self._prof: torch.profiler.profile | None = None
        self._hooks: _RangeHooks | None = None

    @property
    def enabled(self) -> bool:
        return self.opts.enabled

    def start(self, model: nn.Module) -> None:
        if not self.enabled:
            return
        os.makedirs(self.trace_dir, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        o = self.opts
        self._prof = torch.profiler.profile(
            activities=activities, on_trace_ready=self._window_done,
            schedule=torch.profiler.schedule(wait=o.wait, warmup=o.warmup, active=o.steps, repeat=o.repeat))
        modules = phase_modules(model)
        self._hooks = _RangeHooks(modules)
        log.info("rank %d: profiling %d step(s) after %d skipped + %d warm-up (%s); ranges for %s; traces in %s",
                 self.rank, o.steps, o.wait, o.warmup,
                 "once" if o.repeat == 1 else ("until the end" if o.repeat == 0 else f"{o.repeat} windows"),
                 ", ".join(sorted(modules)) or "no vision tower / projector found (all in lm_forward)",
                 self.trace_dir)
        self._prof.start()

    def begin_step(self, step: int) -> None:
        if self._prof is not None:
            self._step_range = record_function(f"{STEP_PREFIX}{step}")
            self._step_range.__enter__()

    def end_step(self, step: int, seconds: float) -> None:
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None
            self._measured[step] = seconds
            for old in [s for s in self._measured if s <= step - self.opts.window()]:
                del self._measured[old]  # only the current window's steps are ever looked up

    def step(self) -> None:
        if self._prof is not None:
            with warnings.catch_warnings():  # "events are cleared after each cycle": wanted, one window each
                warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
                self._prof.step()
            if self.opts.repeat and self.windows >= self.opts.repeat:
                self.stop()  # every window recorded: no profiler, no ranges, no hooks from here on

    def stop(self) -> None:
        if self._prof is None:
            return
        try:
            self._prof.stop()  # a window still recording is cut short and reported
        finally:
            self._prof = None
            if self._hooks is not None:
                self._hooks.remove()
                self._hooks = None

    def _window_done(self, prof: torch.profiler.profile) -> None:
        self.windows += 1
        b = breakdown_from_events(profiler_events(prof), self._measured, rank=self.rank)
        if b is None:
            log.warning("rank %d: a profiling window ended without a complete training step", self.rank)
            return
        trace = os.path.join(self.trace_dir, f"rank{self.rank}.steps{b.steps[0] + 1}-{b.steps[-1] + 1}.pt.trace.json")
        prof.export_chrome_trace(trace)
        b.trace = trace
        for s in b.steps:
            self._measured.pop(s, None)
        self.breakdowns.append(b)
        self.on_breakdown(b)
