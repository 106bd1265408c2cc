"""Dynamic-resolution images as flattened patches (Qwen2-VL layout), shared by collate and DALI.

An (H, W, 3) uint8 image with H, W multiples of patch*merge becomes
(gh * gw, 3 * patch * patch) uint8 rows, gh = H / patch, gw = W / patch.
Rows are ordered merge-block by merge-block (each block of merge x merge
neighbouring patches is contiguous) so a patch merger can reshape
(n / merge^2, merge^2 * dim) without gathering. Each row is channel-major
(C, patch, patch), the layout of a Conv2d patch embedding's weight.
"""
from __future__ import annotations

import numpy as np


def flatten_patches(image: np.ndarray, patch: int, merge: int = 1, out: np.ndarray | None = None) -> np.ndarray:
    """(H, W, 3) uint8 -> (gh * gw, 3 * patch * patch) uint8, written into `out` when given."""
    h, w, c = image.shape
    f = patch * merge
    if h % f or w % f:
        raise ValueError(f"image {w}x{h} is not a multiple of patch*merge = {f}")
    gh, gw = h // patch, w // patch
    x = image.reshape(gh // merge, merge, patch, gw // merge, merge, patch, c)
    # -> (block row, block col, row in block, col in block, channel, py, px)
    x = x.transpose(0, 3, 1, 4, 6, 2, 5)
    if out is None:
        return np.ascontiguousarray(x).reshape(gh * gw, c * patch * patch)
    if out.shape != (gh * gw, c * patch * patch):
        raise ValueError(f"out has shape {out.shape}, expected {(gh * gw, c * patch * patch)}")
    out.reshape(x.shape)[...] = x                  # one strided copy, straight into `out`
    return out


def unflatten_patches(rows: np.ndarray, grid: tuple[int, int], patch: int, merge: int = 1) -> np.ndarray:
    """Inverse of `flatten_patches`: rows and (gh, gw) -> (H, W, 3)."""
    gh, gw = grid
    c = rows.shape[1] // (patch * patch)
    x = rows.reshape(gh // merge, gw // merge, merge, merge, c, patch, patch)
    x = x.transpose(0, 2, 5, 1, 3, 6, 4)
    return np.ascontiguousarray(x).reshape(gh * patch, gw * patch, c)


def pack_patches(images: list[np.ndarray], patch: int, merge: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flatten several images: (patches [P, 3*p*p] uint8, grid int32 [n, 3] as (t=1, gh, gw),
    vision_cu_seqlens int32 [n + 1])."""
    rows = [flatten_patches(im, patch, merge) for im in images]
    grid = np.asarray([(1, im.shape[0] // patch, im.shape[1] // patch) for im in images], dtype=np.int32).reshape(-1, 3)
    counts = np.asarray([len(r) for r in rows], dtype=np.int64)
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    patches = np.concatenate(rows) if rows else np.zeros((0, 3 * patch * patch), np.uint8)
    return patches, grid, cu
