"""Choosing a decoder by name: "turbo", "pillow", "dali" or "auto".

Two places decode:
- DataLoader workers, on CPU: `make_decoder(name)` returns an `ImageDecoder`
  (TurboJPEG via simplejpeg, Pillow-SIMD, or DALI-CPU).
- the training process, on the GPU: `make_gpu_stage(name, policy)` returns a
  `DaliGpuStage` when nvJPEG decode is usable (then the dataset defers decode
  and workers ship encoded bytes), else None.

"auto" on CPU is "turbo" when simplejpeg imports, else "pillow". On the 2-core
Xeon this was built on, TurboJPEG with DCT-scaled decode (n/8, see
decode/turbo.py) plus a Pillow-SIMD resize beats Pillow-SIMD's draft mode
(tools/bench_loader.py reports both single-core rates), and Pillow-SIMD
delivers about 2x the images/s of DALI-CPU, at 336x336 and with dynamic
resolution alike (DALI-CPU at x0.33-0.66 of Pillow across runs of
tools/bench_decode.py, numbers in BENCHMARKS.md). All three decode with
libjpeg-turbo; DALI loses in its CPU resize (about 2.4x slower than
Pillow-SIMD's AVX2 resampler here) and has no DCT-scaled decode. A machine
measured otherwise can record its own winner with `tools/bench_decode.py
--save-choice` (a small JSON in ~/.cache/vlmdata keyed by CPU model and library
versions, simplejpeg's included, so a record made before TurboJPEG was
installed no longer applies); "auto" reads it. Choosing by a per-process timing
run was rejected: on a busy machine two DataLoader workers could pick different
decoders and so produce slightly different pixels for the same epoch.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from vlmdata.decode.interface import ImageDecoder
from vlmdata.decode.policy import ImagePolicy
from vlmdata.sysinfo import cpu_model

log = logging.getLogger(__name__)

CPU_DECODERS = ("turbo", "pillow", "dali")


def choice_path() -> Path:
    """Where a measured CPU-decoder choice is cached (VLMDATA_CACHE_DIR or ~/.cache/vlmdata)."""
    root = os.environ.get("VLMDATA_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "vlmdata")
    return Path(root) / "decode-choice.json"


def machine_key() -> str:
    """CPU model, core count and decoder library versions: a cached choice is valid only for these."""
    return (f"{cpu_model()}|{os.cpu_count()}|PIL {_version('PIL')}|DALI {_version('nvidia.dali')}"
            f"|simplejpeg {_version('simplejpeg')}")


def _version(module: str) -> str:
    try:
        mod = __import__(module, fromlist=["__version__"])
    except ImportError:
        return "absent"
    return str(getattr(mod, "__version__", "?"))


def save_cpu_choice(name: str, evidence: dict, path: Path | None = None) -> Path:
    """Record the measured fastest CPU decoder for this machine (atomic write)."""
    if name not in CPU_DECODERS:
        raise ValueError(f"unknown CPU decoder {name!r}")
    path = path or choice_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"machine": machine_key(), "decoder": name, "evidence": evidence}, indent=1))
    os.replace(tmp, path)
    return path


def cached_cpu_choice(path: Path | None = None) -> str | None:
    """The recorded choice if it was measured on this machine with these versions, else None."""
    path = path or choice_path()
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("machine") != machine_key() or rec.get("decoder") not in CPU_DECODERS:
        return None
    return rec["decoder"]


def default_cpu_decoder() -> str:
    """The fixed choice without a measurement: "turbo" when simplejpeg imports, else "pillow"."""
    from vlmdata.decode.turbo import turbo_available

    return "turbo" if turbo_available() else "pillow"


def fastest_cpu_decoder() -> str:
    """The decoder a measurement on this machine recorded (if its library imports), else the default."""
    choice = cached_cpu_choice() or default_cpu_decoder()
    if choice == "dali" and not dali_available():
        return default_cpu_decoder()
    if choice == "turbo" and default_cpu_decoder() != "turbo":
        return "pillow"
    return choice


def dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def gpu_decode_available() -> bool:
    """True when DALI imports and torch sees a CUDA device (nvJPEG "mixed" decode usable)."""
    if not dali_available():
        return False
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)


def make_decoder(name: str = "auto", pixels: str = "fast", resample: int = 3, crop: bool = False) -> ImageDecoder:
    """A CPU-side decoder usable inside DataLoader workers.

    pixels="exact": the image processor's pixels (`decode.exact.ExactDecoder` with the folder's
    `resample` filter and, for CLIP-style processors, `crop`); only Pillow decodes them ("auto" and
    "pillow"; "turbo" and "dali" are fast-mode decoders). pixels="fast": the named decoder.
    """
    from vlmdata.decode.exact import ExactDecoder, check_pixels

    if check_pixels(pixels) == "exact":
        if name not in ("auto", "pillow"):
            raise ValueError(f"decoder={name!r} decodes fast pixels only (DCT-scaled or its own resize): use "
                             "decoder='auto' or 'pillow' for the processor's exact pixels, or pixels='fast'")
        return ExactDecoder(resample=resample, crop=crop)
    if name == "auto":
        name = fastest_cpu_decoder()
    if name == "pillow":
        from vlmdata.decode.pillow import PillowDecoder

        return PillowDecoder()
    if name == "turbo":
        from vlmdata.decode.turbo import TurboDecoder, turbo_available

        if not turbo_available():
            raise ValueError("decoder='turbo' needs simplejpeg (libjpeg-turbo's TurboJPEG): pip install simplejpeg")
        return TurboDecoder()
    if name == "dali":
        if not dali_available():
            raise ValueError("decoder='dali' needs NVIDIA DALI: pip install 'vlmdata[dali]' (nvidia-dali-cuda120)")
        from vlmdata.decode.dali.cpu import DaliCpuDecoder

        return DaliCpuDecoder()
    raise ValueError(f"unknown decoder {name!r}: use 'turbo', 'pillow', 'dali' or 'auto'")


def make_gpu_stage(name: str, policy: ImagePolicy, device_id: int | None = None,
                   image_token_id: int | None = None):
    """A `DaliGpuStage` for decoder "dali"/"auto" when a CUDA GPU and DALI are usable, else None.

    Use it with `DatasetOptions(defer_decode=True)` and call `stage(batch)` on each pack in the
    training process. device_id defaults to LOCAL_RANK (torchrun) or 0; image_token_id (the
    dataset's `collate_config.image_token_id`) lets a corrupt image cost only its own sample.
    """
    if name not in ("turbo", "pillow", "dali", "auto"):
        raise ValueError(f"unknown decoder {name!r}: use 'turbo', 'pillow', 'dali' or 'auto'")
    if name in ("turbo", "pillow") or not gpu_decode_available():
        return None
    from vlmdata.decode.dali.gpu import DaliGpuStage, GpuStageOptions

    if device_id is None:
        device_id = int(os.environ.get("LOCAL_RANK", "0"))
    return DaliGpuStage(policy, GpuStageOptions(device="mixed", device_id=device_id, image_token_id=image_token_id))
