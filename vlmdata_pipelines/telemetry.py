"""GPU telemetry and optimizer health for the training loop.

- `GpuTelemetry`: this rank's GPU through NVML (the `nvidia-ml-py` package, imported as `pynvml`):
  utilisation, memory used, its peak over the run's samples, memory total; plus PyTorch's
  `torch.cuda.max_memory_allocated` (this process's allocator peak). On a machine without a
  CUDA device, without NVML's library or without the package it is disabled, and `reason` says
  why (the trainer logs it once and puts it in its result); nothing fails.
- `gradient_norm`: the global gradient norm of a step, clipping when asked (DDP and FSDP2).

The trainer samples once per step, after the step's timer stopped, so NVML's cost (tens of
microseconds) is not in the step time. NVML's utilisation is the fraction of its last sample
period (1/6 s to 1 s, by driver) in which a kernel ran.
"""
from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass

import torch
from torch import nn

__all__ = ["GpuSample", "GpuTelemetry", "gradient_norm"]

log = logging.getLogger(__name__)


@dataclass
class GpuSample:
    """One reading of this rank's GPU."""

    gpu: str                    # NVML index of the device (its label in the metrics)
    utilization: float | None   # 0-1 (None without NVML)
    memory_used: int | None     # bytes used on the device, all processes (None without NVML)
    memory_peak: int | None     # largest memory_used sampled so far
    memory_total: int | None
    max_allocated: int          # torch.cuda.max_memory_allocated of this process

    def to_dict(self) -> dict:
        return asdict(self)


def _nvml_handle(nvml, device: torch.device):
    """The NVML handle of a CUDA device: by UUID when torch knows it, else by index (CUDA_VISIBLE_DEVICES)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        try:
            return nvml.nvmlDeviceGetHandleByUUID(text if text.startswith("GPU-") else f"GPU-{text}")
        except nvml.NVMLError:
            pass
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    if visible != [""] and index < len(visible) and visible[index].strip().isdigit():
        index = int(visible[index])
    return nvml.nvmlDeviceGetHandleByIndex(index)


class GpuTelemetry:
    """Samples one CUDA device; `enabled` is False (with a `reason`) where that is impossible."""

    def __init__(self, device: torch.device, nvml=None, handle=None, reason: str | None = None):
        self.device = device
        self._nvml, self._handle = nvml, handle
        self.reason = reason
        self.gpu = ""
        self.peak_used: int | None = None
        self.samples = 0
        self._util_sum = 0.0
        self.last: GpuSample | None = None
        if handle is not None:
            self.gpu = str(nvml.nvmlDeviceGetIndex(handle))

    @property
    def enabled(self) -> bool:
        """True when the device is a CUDA device (allocator figures), with or without NVML."""
        return self.device.type == "cuda"

    @property
    def nvml(self) -> bool:
        return self._handle is not None

    @classmethod
    def open(cls, device: torch.device) -> GpuTelemetry:
        if device.type != "cuda":
            build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
            return cls(device, reason=f"no CUDA device (training on {device}; torch {torch.__version__}, {build})")
        try:
            import pynvml as nvml
        except ImportError:
            return cls(device, reason="NVML not available: the nvidia-ml-py package is not installed "
                                      "(pip install nvidia-ml-py); only torch's allocator peak is reported")
        try:
            nvml.nvmlInit()
            handle = _nvml_handle(nvml, device)
        except nvml.NVMLError as e:
            return cls(device, reason=f"NVML not available ({e}); only torch's allocator peak is reported")
        return cls(device, nvml, handle)

    def describe(self) -> str:
        if not self.enabled:
            return f"GPU telemetry off: {self.reason}"
        if not self.nvml:
            return f"GPU telemetry: allocator peak only, {self.reason}"
        name = self._nvml.nvmlDeviceGetName(self._handle)
        name = name.decode() if isinstance(name, bytes) else name
        return f"GPU telemetry: NVML device {self.gpu} ({name}) and torch's allocator peak"

    def sample(self) -> GpuSample | None:
        """A reading now, or None when disabled."""
        if not self.enabled:
            return None
        util = used = total = None
        if self.nvml:
            nvml, h = self._nvml, self._handle
            util = nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            used, total = int(mem.used), int(mem.total)
            self.peak_used = max(self.peak_used or 0, used)
            self._util_sum += util
        self.samples += 1
        self.last = GpuSample(gpu=self.gpu or str(self.device.index or 0), utilization=util, memory_used=used,
                              memory_peak=self.peak_used, memory_total=total,
                              max_allocated=int(torch.cuda.max_memory_allocated(self.device)))
        return self.last

    def summary(self) -> dict:
        """For the trainer's result: enabled/reason, the peaks, mean utilisation over the samples."""
        out = {"enabled": self.enabled, "nvml": self.nvml, "reason": self.reason, "samples": self.samples}
        if self.last is not None:
            out.update(gpu=self.last.gpu, memory_peak_bytes=self.peak_used, memory_total_bytes=self.last.memory_total,
                       max_memory_allocated_bytes=self.last.max_allocated,
                       mean_utilization=self._util_sum / self.samples if self.nvml and self.samples else None)
        return out

    def close(self) -> None:
        if self._handle is not None:
            self._handle = None
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as e:
                log.debug("nvmlShutdown: %s", e)


def gradient_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """The total L2 norm of the gradients (before clipping); clips to `max_norm` when it is > 0.

    With FSDP2 the gradients are sharded DTensors and the norm comes back as one: its full
    value is returned. A model without gradients gives 0.
    """
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return torch.zeros(())
    if max_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
