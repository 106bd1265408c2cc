"""DALI CPU decoder: the `ImageDecoder` used inside DataLoader workers when decoder="dali".

Decodes a whole call's images in one DALI run (libjpeg-turbo via nvImageCodec)
and resizes each to the policy's target size, computed from the *indexed*
width and height so the output matches what the planner counted, token for
token. Output is uint8 HWC, like the Pillow decoder.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from vlmdata.decode.dali.pipeline import DaliConfig, DaliRunner
from vlmdata.decode.policy import ImagePolicy
from vlmdata.errors import Skip


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
        self._reported = 0

    @property
    def errors(self):
        """Counts of undecodable images by detailed reason (empty, not_an_image, decode_error)."""
        return self.runner.errors

    def pop_errors(self) -> Counter:
        """Images rejected since the last call, as {"corrupt_image": n} (the Pillow decoder's reason)."""
        n = sum(self.runner.errors.values()) - self._reported
        self._reported += n
        return Counter({Skip.CORRUPT_IMAGE: n}) if n else Counter()

    def decode(self, images: list, sizes: list[tuple[int, int]], policy: ImagePolicy) -> list[np.ndarray | None]:
        """Per image: (H, W, 3) uint8 of `policy.target_size(w, h)`, or None when it is corrupt."""
        if not images:
            return []
        return self.runner.run(images, target_hw(policy, sizes), _to_numpy)
