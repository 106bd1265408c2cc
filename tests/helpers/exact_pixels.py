"""References for the processor-exact pixel tests: transformers' PIL image processors on `load_image`'s image,
and vlmdata's decode + adapter layout of the same encoded bytes."""
from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from tests.helpers.image_zoo import picture, save

# JPEG sizes from 64 to 1,344 px with extreme aspect ratios: smart_resize scales these up, down and rounds.
JPEG_SIZES = [(64, 64), (1344, 1008), (1344, 64), (64, 1344), (333, 500), (1000, 999), (97, 211), (800, 120)]


def sized_jpegs(seed: int = 0) -> dict[str, bytes]:
    """Textured JPEGs (a gradient plus noise, so every filter tap matters) of JPEG_SIZES."""
    rng = np.random.default_rng(seed)
    out = {}
    for w, h in JPEG_SIZES:
        base = np.asarray(Image.fromarray(picture()).resize((w, h), Image.Resampling.BILINEAR), np.int16)
        arr = np.clip(base + rng.integers(-40, 41, (h, w, 3)), 0, 255).astype(np.uint8)
        out[f"jpeg_{w}x{h}"] = save(Image.fromarray(arr), "JPEG", quality=90)
    return out


def hf_pixels(image_processor, data: bytes) -> dict:
    """The processor's output for one encoded image, opened as transformers' `load_image` opens it."""
    from transformers.image_utils import load_image

    with Image.open(io.BytesIO(data)) as img:
        return image_processor(images=[load_image(img)], return_tensors="pt")


def qwen_rows(image: np.ndarray, spec) -> torch.Tensor:
    """vlmdata's decoded (H, W, 3) uint8 image as the Qwen adapter gives it to the model: normalised patch rows."""
    from vlmdata.decode import pack_patches
    from vlmdata.hf import qwen_patches

    rows, _, _ = pack_patches([image], spec.patch_size, spec.merge_size)
    return qwen_patches(torch.from_numpy(rows), spec.patch_size, spec.temporal_patch_size, spec.image_mean,
                        spec.image_std, torch.float32)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def tile_rows_diff(got: torch.Tensor, rows: list[torch.Tensor]) -> float:
    """Worst difference of per-image tile rows ([images, most tiles, 3, S, S], zero-padded) from the processor's
    rows (each zero-padded to its own batch's most tiles); past the shorter of the two both are padding only."""
    assert got.shape[0] == len(rows), (got.shape, len(rows))
    worst = 0.0
    for row, want in zip(got, rows):
        k = min(len(want), len(row))
        worst = max(worst, max_diff(row[:k], want[:k]))
        assert not row[k:].any() and not want[k:].any()
    return worst

