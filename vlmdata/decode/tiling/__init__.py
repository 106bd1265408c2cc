"""One module per tiled model family's image policy (`decode.tiled.TiledPolicy`), named by its kind;
each module's `POLICY` is the class `make_policy` rebuilds from a manifest. Shared pieces:
`grid_tiles` (a resized image cut into its grid of tiles, row by row)."""
from __future__ import annotations

import numpy as np

__all__ = ["grid_tiles"]


def grid_tiles(image: np.ndarray, rows: int, cols: int, out: np.ndarray | None = None) -> np.ndarray:
    """(rows * cols, th, tw, C) tiles of an (rows * th, cols * tw, C) array, row-major (left to right,
    then top to bottom: the processors' order); written into `out` when given."""
    h, w = image.shape[:2]
    if h % rows or w % cols:
        raise ValueError(f"a {w}x{h} image does not split into {rows} rows x {cols} columns of equal tiles")
    th, tw = h // rows, w // cols
    tiles = image.reshape(rows, th, cols, tw, *image.shape[2:]).swapaxes(1, 2)
    tiles = tiles.reshape(rows * cols, th, tw, *image.shape[2:])
    if out is None:
        return np.ascontiguousarray(tiles)
    out[...] = tiles
    return out
