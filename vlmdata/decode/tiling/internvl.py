"""InternVL3 / InternVL3.5 tiling, as transformers' `InternVLProcessor` does it with its
`GotOcr2ImageProcessor` (`crop_to_patches=True`, which the processor always passes).

An image of (w, h) gets the grid of `cols x rows` square tiles whose aspect ratio `cols / rows` is
closest to `w / h`, among the grids of `min_tiles` to `max_tiles` tiles (ordered by tile count); on
a tie the later grid (more tiles) wins while the image's area exceeds half the grid's pixel area
(`get_optimal_tiled_canvas`). The image is resized to `cols * tile x rows * tile` and cut row by
row; a grid of more than one tile is followed by a thumbnail (the whole image resized to one tile).
`max_tiles <= 1` gives one tile (the image resized). Each tile is `per_tile` `<IMG_CONTEXT>` tokens
(`image_seq_length`: (tile / patch)^2 / 4 after the pixel shuffle), so the stored placeholder
`<img><IMG_CONTEXT></img>` expands its one image token to `per_tile x tiles` of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from PIL import Image

from vlmdata.decode.tiled import TiledPolicy
from vlmdata.decode.tiling import grid_tiles

__all__ = ["POLICY", "InternVLPolicy"]


@dataclass(frozen=True)
class InternVLPolicy(TiledPolicy):
    """InternVL's dynamic tiling (see the module docstring)."""

    kind = "internvl"
    merge: int = 2                   # the pixel shuffle (downsample_ratio 0.5) merges 2 x 2 patches
    per_tile: int = 256              # image tokens per tile (image_seq_length)
    min_tiles: int = 1               # min_patches
    max_tiles: int = 12              # max_patches

    def __post_init__(self):
        if self.tile < 1 or self.per_tile < 1 or self.min_tiles < 1:
            raise ValueError(f"InternVL tiling needs tile, per_tile and min_tiles >= 1, got {self}")

    @cached_property
    def _grids(self) -> tuple[np.ndarray, np.ndarray]:
        """(cols, rows) of the allowed grids in the processor's order: by tile count, then columns."""
        grids = [(c, r) for c in range(1, self.max_tiles + 1) for r in range(1, self.max_tiles + 1)
                 if self.min_tiles <= c * r <= self.max_tiles]
        grids.sort(key=lambda g: g[0] * g[1])
        return np.asarray([g[0] for g in grids], np.int64), np.asarray([g[1] for g in grids], np.int64)

    def tile_grid(self, width, height) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised (cols, rows) of each image's tile grid (1 x 1 when tiling is off)."""
        w = np.asarray(width, np.int64)
        h = np.asarray(height, np.int64)
        cols, rows = self._grids
        best = np.full(np.broadcast(w, h).shape, -1, np.int64)
        if self.max_tiles <= 1 or len(cols) == 0:
            return np.ones_like(best), np.ones_like(best)
        aspect = w / h
        area = w * h
        best_diff = np.full(best.shape, np.inf)
        half_tile = 0.5 * self.tile * self.tile
        for i, (c, r) in enumerate(zip(cols.tolist(), rows.tolist())):
            diff = np.abs(aspect - c / r)
            closer = diff < best_diff
            take = closer | ((diff == best_diff) & (area > half_tile * c * r))
            best_diff = np.where(closer, diff, best_diff)
            best = np.where(take, i, best)
        return cols[best], rows[best]

    def tiles(self, width, height) -> np.ndarray:
        cols, rows = self.tile_grid(width, height)
        n = cols * rows
        return n + (n > 1)

    def tokens(self, width, height) -> np.ndarray:
        return self.per_tile * self.tiles(width, height)

    def layout_key(self, width: int, height: int) -> int:
        return int(self.tiles(width, height))

    def build_expansion(self, key: int) -> np.ndarray:
        return np.full(self.per_tile * key, self.image_token_id, np.int64)

    def pixels(self, image: Image.Image, resample: int) -> np.ndarray:
        cols, rows = (int(x) for x in self.tile_grid(image.width, image.height))
        s = self.tile
        n = cols * rows
        out = np.empty((n + (n > 1), s, s, 3), np.uint8)
        grid_tiles(np.asarray(image.resize((cols * s, rows * s), resample)), rows, cols, out=out[:n])
        if n > 1:
            out[n] = np.asarray(image.resize((s, s), resample))
        return out


POLICY = InternVLPolicy
