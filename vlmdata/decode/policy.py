"""Image policies: how big each image becomes and how many tokens it costs.

Fixed (LLaVA-1.5) and dynamic (Qwen-VL) policies are here; tiled ones (InternVL, Idefics3, ...) in
`decode.tiled` and `decode.tiling`.

The planner calls `tokens(width, height)` on whole numpy arrays of indexed
image sizes (no decode), and decoders call `target_size(width, height)` per
image, so what is packed is exactly what is decoded.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlmdata.decode.tiled import TiledPolicy, tiled_policy


@dataclass(frozen=True)
class FixedPolicy:
    """Every image resized to size x size; tokens = (size/patch)^2 / merge^2."""

    size: int = 336
    patch: int = 14
    merge: int = 1

    def __post_init__(self) -> None:
        if self.size % (self.patch * self.merge):
            raise ValueError(f"image size {self.size} must be a multiple of patch*merge = {self.patch * self.merge}")

    @property
    def tokens_per_image(self) -> int:
        side = self.size // self.patch
        return side * side // (self.merge * self.merge)

    def tokens(self, width, height) -> np.ndarray:
        """Image tokens for each (width, height); vectorised."""
        return np.full(np.shape(width), self.tokens_per_image, dtype=np.int64)

    def target_size(self, width: int, height: int) -> tuple[int, int]:
        """(out_width, out_height) for one image."""
        return self.size, self.size

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """Patch grid (rows, cols) of the resized image."""
        return self.size // self.patch, self.size // self.patch

    def to_dict(self) -> dict:
        return {"kind": "fixed", "size": self.size, "patch": self.patch, "merge": self.merge}


@dataclass(frozen=True)
class DynamicPolicy:
    """Aspect-preserving resize with sides multiple of patch*merge and pixels in [min, max].

    The rule (as in Qwen2-VL): round each side to the nearest multiple of
    f = patch*merge; if the area is above max_pixels scale both sides down by
    sqrt(area/max) and floor to f; if below min_pixels scale up and ceil to f.
    """

    patch: int = 14
    merge: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 448 * 448

    @property
    def factor(self) -> int:
        return self.patch * self.merge

    def _sizes(self, width, height):
        f = self.factor
        w = np.asarray(width, dtype=np.float64)
        h = np.asarray(height, dtype=np.float64)
        w = np.maximum(w, 1.0)
        h = np.maximum(h, 1.0)
        hb = np.round(h / f) * f          # may be 0 for a side under f/2: then the area is below min_pixels
        wb = np.round(w / f) * f
        area = hb * wb
        big = area > self.max_pixels
        small = area < self.min_pixels
        beta_down = np.sqrt((h * w) / self.max_pixels)
        beta_up = np.sqrt(self.min_pixels / (h * w))
        hb = np.where(big, np.maximum(f, np.floor(h / beta_down / f) * f), hb)
        wb = np.where(big, np.maximum(f, np.floor(w / beta_down / f) * f), wb)
        hb = np.where(small, np.ceil(h * beta_up / f) * f, hb)
        wb = np.where(small, np.ceil(w * beta_up / f) * f, wb)
        return wb.astype(np.int64), hb.astype(np.int64)

    def tokens(self, width, height) -> np.ndarray:
        w, h = self._sizes(width, height)
        return (w // self.patch) * (h // self.patch) // (self.merge * self.merge)

    def target_size(self, width: int, height: int) -> tuple[int, int]:
        w, h = self._sizes(width, height)
        return int(w), int(h)

    def grid(self, width: int, height: int) -> tuple[int, int]:
        w, h = self.target_size(width, height)
        return h // self.patch, w // self.patch

    def to_dict(self) -> dict:
        return {"kind": "dynamic", "patch": self.patch, "merge": self.merge,
                "min_pixels": self.min_pixels, "max_pixels": self.max_pixels}


ImagePolicy = FixedPolicy | DynamicPolicy | TiledPolicy


def make_policy(spec) -> ImagePolicy:
    """An int (fixed size), a policy object, or a dict from `to_dict()` (a tiled family's too:
    `decode.tiled`)."""
    if isinstance(spec, (FixedPolicy, DynamicPolicy, TiledPolicy)):
        return spec
    if isinstance(spec, int):
        return FixedPolicy(size=spec)
    if isinstance(spec, dict):
        kind = spec.get("kind")
        args = {k: v for k, v in spec.items() if k != "kind"}
        if kind == "fixed":
            return FixedPolicy(**args)
        if kind == "dynamic":
            return DynamicPolicy(**args)
        tiled = tiled_policy(spec)
        if tiled is not None:
            return tiled
    raise ValueError(f"cannot make an image policy from {spec!r}: pass an int size, FixedPolicy or DynamicPolicy")


