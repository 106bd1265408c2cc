"""uint8 pixels to what a Hugging Face vision tower takes, on whatever device the pixels are on.

Packs carry uint8 pixels (4x fewer bytes than float32 across PCIe); these
functions run after the copy, so normalisation happens on the GPU when the
pixels are there and in torch on the CPU otherwise. The values are the
processors' own, bit for bit: transformers rescales in float64 (x * 1/255),
casts to float32 and normalises in float32 ((x - mean) / std); as a uint8 pixel
has 256 values, that arithmetic is done once per channel and value, in numpy
exactly as the processor does it, and applied as a 3 x 256 lookup table on the
pixels' device. The result is then cast to the model's dtype.

- `qwen_patches`: vlmdata's flattened patches (decode/patches.py: rows in
  merge-block order, each row channel-major (C, py, px)) become the Qwen2-VL
  processor's rows (C, temporal, py, px): the row order is already the
  processor's, and a still image's single frame is repeated
  `temporal_patch_size` times, as the processor repeats it.
- `fixed_to_patches`: [n, 3, S, S] images (a fixed policy) cut into those rows.
- `clip_pixels`: [n, 3, S, S] images normalised in place of layout (LLaVA).

Floating input is taken as already normalised (the DALI stage normalises with
the same CLIP mean/std); only its layout is changed.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from vlmdata.errors import AdapterError

__all__ = ["clip_pixels", "fixed_to_patches", "normalize", "qwen_patches"]


@lru_cache(maxsize=16)
def _table(mean: tuple, std: tuple) -> np.ndarray:
    """float32 [3, 256]: the processor's normalised value of each uint8 value in each channel."""
    values = (np.arange(256, dtype=np.float64) * (1 / 255)).astype(np.float32)
    m = np.asarray(mean, dtype=np.float32)[:, None]
    s = np.asarray(std, dtype=np.float32)[:, None]
    return (values[None, :] - m) / s


def normalize(x: torch.Tensor, mean, std, channel_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """(x / 255 - mean) / std over `channel_dim` as the processors compute it, returned as `dtype`."""
    if x.dtype != torch.uint8:
        raise AdapterError(f"normalize takes uint8 pixels, got {x.dtype}")
    if x.shape[channel_dim] != 3:
        raise AdapterError(f"expected 3 channels on dim {channel_dim}, got shape {list(x.shape)}")
    table = torch.from_numpy(_table(tuple(float(v) for v in mean), tuple(float(v) for v in std)))
    table = table.to(device=x.device, dtype=dtype)
    shape = [1] * x.dim()
    shape[channel_dim] = 3
    offset = (torch.arange(3, device=x.device) * 256).view(shape)
    return torch.take(table.reshape(-1), x.to(torch.int64).add_(offset))   # 3x faster than [] indexing on CPU


def _check_rows(rows: torch.Tensor, patch: int) -> None:
    if rows.dim() != 2 or rows.shape[1] != 3 * patch * patch:
        raise AdapterError(f"flattened patches must be [N, 3*{patch}*{patch}] = [N, {3 * patch * patch}], "
                           f"got {list(rows.shape)}: the dataset's patch size and the model's must agree")


def qwen_patches(rows: torch.Tensor, patch: int, temporal: int, mean, std, dtype: torch.dtype) -> torch.Tensor:
    """[N, 3*p*p] patch rows -> [N, 3*temporal*p*p] normalised rows, the Qwen2-VL processor's layout.

    Floating rows already [N, 3*temporal*p*p] are taken as final (cast only)."""
    if rows.is_floating_point() and rows.dim() == 2 and rows.shape[1] == 3 * temporal * patch * patch:
        return rows.to(dtype)
    _check_rows(rows, patch)
    n = rows.shape[0]
    x = rows.view(n, 3, 1, patch * patch)
    x = normalize(x, mean, std, channel_dim=1, dtype=dtype) if x.dtype == torch.uint8 else x.to(dtype)
    return x.expand(n, 3, temporal, patch * patch).reshape(n, 3 * temporal * patch * patch)


def video_patches(rows: torch.Tensor, mean, std, dtype: torch.dtype) -> torch.Tensor:
    """[N, 3*tp*p*p] uint8 video patch rows (channel-major, the processor's layout) -> normalised `dtype`
    rows of the same shape; floating rows are taken as final (cast only)."""
    if rows.is_floating_point():
        return rows.to(dtype)
    if rows.dim() != 2 or rows.shape[1] % 3:
        raise AdapterError(f"video patch rows must be [N, 3*tp*p*p], got {list(rows.shape)}")
    n = rows.shape[0]
    return normalize(rows.view(n, 3, -1), mean, std, channel_dim=1, dtype=dtype).reshape(rows.shape)


def fixed_to_patches(images: torch.Tensor, patch: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, 3, H, W] -> (patch rows [n*gh*gw, 3*p*p] in merge-block order, grid_thw int64 [n, 3])."""
    n, c, h, w = images.shape
    f = patch * merge
    if c != 3 or h % f or w % f:
        raise AdapterError(f"images {list(images.shape)} must be [n, 3, H, W] with H, W multiples of "
                           f"patch*merge = {f}")
    gh, gw = h // patch, w // patch
    x = images.reshape(n, c, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.permute(0, 2, 5, 3, 6, 1, 4, 7)   # n, block row, block col, row in block, col in block, c, py, px
    rows = x.reshape(n * gh * gw, c * patch * patch)
    grid = torch.tensor([[1, gh, gw]], dtype=torch.int64).repeat(n, 1)
    return rows, grid


def clip_pixels(images: torch.Tensor, size: int, mean, std, dtype: torch.dtype) -> torch.Tensor:
    """[n, 3, S, S] uint8 -> normalised [n, 3, S, S] (floating input: cast only)."""
    if images.dim() != 4 or images.shape[1] != 3 or images.shape[2] != size or images.shape[3] != size:
        raise AdapterError(f"pixel_values must be [n, 3, {size}, {size}] for this model, got {list(images.shape)}: "
                           f"load the dataset with image_size=FixedPolicy({size})")
    if images.dtype == torch.uint8:
        return normalize(images, mean, std, channel_dim=1, dtype=dtype)
    return images.to(dtype)
