"""DALI CPU decoder: the `ImageDecoder` used inside DataLoader workers when decoder="dali".

Decodes a whole call's images in one DALI run (libjpeg-turbo via nvImageCodec)
and resizes each to the policy's target size, computed from the *indexed*
width and height so the output matches what the planner counted, token for
token. Output is uint8 HWC as displayed, like the Pillow decoder.

Formats DALI gets wrong or rejects (GIF, TIFF, 16-bit PNG, ...) and any image
it fails on are decoded by a `PillowDecoder` instead, image by image
(`decode.dali.routing`); `fallbacks` counts them by why ("format": sent to the
CPU up front, "dali_failed": DALI tried and failed). Only images the CPU
decoder rejects too come back as None.
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

import numpy as np

from vlmdata.decode.dali.pipeline import SYSTEMIC_MIN, DaliConfig, DaliRunner
from vlmdata.decode.dali.routing import plan_decode
from vlmdata.decode.pillow import PillowDecoder
from vlmdata.decode.policy import ImagePolicy
from vlmdata.orientation import apply_orientation

log = logging.getLogger(__name__)


def target_hw(policy: ImagePolicy, sizes: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(height, width) each image is resized to, from the indexed (width, height)."""
    out = []
    for w, h in sizes:
        tw, th = policy.target_size(int(w), int(h))
        out.append((th, tw))
    return out


def _to_numpy(t) -> np.ndarray:
    return np.array(t, dtype=np.uint8, copy=True)


class DaliCpuDecoder:
    """`ImageDecoder` on a DALI CPU pipeline (no GPU); built lazily in the process that decodes."""

    name = "dali-cpu"

    def __init__(self, max_batch: int = 16, num_threads: int = 1, interp: str = "linear"):
        self.runner = DaliRunner(DaliConfig(device="cpu", max_batch=max_batch,
                                            num_threads=num_threads, interp=interp))
        self.cpu = PillowDecoder(resample="bicubic" if interp == "cubic" else "bilinear")
        self.fallbacks: Counter = Counter()   # images the CPU decoder took: "format" or "dali_failed"

    @property
    def errors(self):
        """Counts of images DALI itself could not decode, by detailed reason (before the CPU fallback)."""
        return self.runner.errors

    def pop_errors(self) -> Counter:
        """Images returned as None since the last call (rejected by the CPU decoder too), by reason."""
        return self.cpu.pop_errors()

    def decode(self, images: list, sizes: list[tuple[int, int]], policy: ImagePolicy) -> list[np.ndarray | None]:
        """Per image: (H, W, 3) uint8 of `policy.target_size(w, h)`, or None when it is corrupt."""
        if not images:
            return []
        return decode_with_fallback(self.runner, self.cpu, self.fallbacks, images, target_hw(policy, sizes))


def decode_with_fallback(runner: DaliRunner, cpu: PillowDecoder, fallbacks: Counter, images: list,
                         hw: list[tuple[int, int]]) -> list[np.ndarray | None]:
    """DALI for what it decodes right, the CPU decoder for the rest and for DALI's failures (counted)."""
    plan = plan_decode(images, hw)
    out: list[np.ndarray | None] = [None] * len(images)
    if plan.dali:
        got = runner.run([images[i] for i in plan.dali], plan.dali_hw, _to_numpy, strict=False)
        for i, arr in zip(plan.dali, got):
            out[i] = None if arr is None else apply_orientation(arr, plan.orientation[i])
    failed = [i for i in plan.dali if out[i] is None]
    for why, idx in (("format", plan.cpu), ("dali_failed", failed)):
        for i in idx:
            note_fallback(fallbacks, why, i)
            h, w = hw[i]
            out[i] = cpu.decode_one(images[i], w, h)
    if len(failed) >= SYSTEMIC_MIN and len(failed) == len(plan.dali) and any(out[i] is not None for i in failed):
        log.warning("DALI failed on all %d images of a call that the CPU decoder decodes: a DALI problem, not "
                    "bad data (each image was decoded on the CPU instead)", len(failed))
    return out


def note_fallback(fallbacks: Counter, why: str, index: int) -> None:
    """Count one image handed to the CPU decoder; the first of each kind is logged."""
    if not fallbacks[why]:
        log.info("DALI: images go to the CPU decoder (%s), e.g. input #%d; counted in `fallbacks`", why, index)
    fallbacks[why] += 1
