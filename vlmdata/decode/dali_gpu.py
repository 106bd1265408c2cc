"""DALI GPU stage: decode a pack's encoded images on the GPU, in the training process.

With `options.defer_decode=True` the dataset's workers ship encoded images
(`image_bytes`: list of bytes, `image_sizes`: int32 [n, 2] indexed (width,
height)) instead of pixels. `DaliGpuStage` decodes them with nvJPEG
(`fn.decoders.image(device="mixed")`), resizes each to the image policy's
target size, normalises on the device (mean/std, CHW float) and fills the
PackedBatch pixel fields as torch tensors on the GPU:

- fixed policy:   `pixel_values` [n_img, 3, S, S]
- dynamic policy: `pixel_values` [total_patches, 3*patch*patch] ((C, ph, pw) per patch,
                  row-major over each image's grid), `image_grid` int32 [n_img, 2] (rows, cols),
                  `vision_cu_seqlens` int32 [n_img + 1]

A corrupt image does not fail the pack: its pixels become zeros (so every
shape the planner counted stays the same), the sample that owns it loses its
loss (labels -100), and it is counted in `batch["stats"]["skipped"]["corrupt_image"]`.

`device="cpu"` runs the same code on DALI's CPU backend (tests, GPU-less runs).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from vlmdata.decode.dali import target_hw
from vlmdata.decode.dali_pipeline import DaliConfig, DaliRunner, Normalization
from vlmdata.decode.policy import DynamicPolicy, ImagePolicy

SKIP_REASON = "corrupt_image"


@dataclass(frozen=True)
class GpuStageOptions:
    """device: "mixed" (GPU decode) or "cpu"; dtype: torch dtype name of pixel_values."""

    device: str = "mixed"
    device_id: int = 0
    max_batch: int = 64
    num_threads: int = 2
    dtype: str = "bfloat16"
    interp: str = "linear"
    normalize: Normalization = field(default_factory=Normalization)


@dataclass
class DecodedImages:
    """The decoded pixel fields of one pack, plus which inputs were bad."""

    pixel_values: torch.Tensor
    image_grid: torch.Tensor | None
    vision_cu_seqlens: torch.Tensor | None
    bad: list[int]


def patchify(img: torch.Tensor, patch: int) -> torch.Tensor:
    """[C, H, W] -> [gh*gw, C*patch*patch], (C, ph, pw) per patch, row-major over the grid."""
    c, h, w = img.shape
    gh, gw = h // patch, w // patch
    return img.reshape(c, gh, patch, gw, patch).permute(1, 3, 0, 2, 4).reshape(gh * gw, c * patch * patch)


def _torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        raise ValueError(f"dtype must be a torch floating dtype name (bfloat16, float16, float32), got {name!r}")
    return dt


class DaliGpuStage:
    """Turns deferred-decode packs into packs with pixel tensors on the device."""

    def __init__(self, policy: ImagePolicy, options: GpuStageOptions | None = None):
        self.policy = policy
        self.options = options or GpuStageOptions()
        opt = self.options
        self.dtype = _torch_dtype(opt.dtype)
        norm = opt.normalize
        if opt.dtype == "float16":
            norm = Normalization(norm.mean, norm.std, "float16")
        self.runner = DaliRunner(DaliConfig(
            device=opt.device, max_batch=opt.max_batch, num_threads=opt.num_threads,
            device_id=opt.device_id if opt.device == "mixed" else None, interp=opt.interp, normalize=norm))
        self.torch_device = torch.device(f"cuda:{opt.device_id}") if opt.device == "mixed" else torch.device("cpu")
        self.skipped: Counter = Counter()

    def _to_torch(self, t) -> torch.Tensor:
        from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

        out = torch.empty(t.shape(), dtype=to_torch_type[t.dtype], device=self.torch_device)
        stream = torch.cuda.current_stream(self.torch_device) if self.torch_device.type == "cuda" else None
        feed_ndarray(t, out, cuda_stream=stream)
        return out

    def decode(self, image_bytes: list, image_sizes) -> DecodedImages:
        """Decode and lay out one pack's images; `image_sizes` is [n, 2] (width, height) from the index."""
        sizes = np.asarray(image_sizes, dtype=np.int64).reshape(-1, 2)
        if len(image_bytes) != len(sizes):
            raise ValueError(f"{len(image_bytes)} images but {len(sizes)} sizes")
        hw = target_hw(self.policy, [tuple(s) for s in sizes.tolist()])
        imgs = self.runner.run(image_bytes, hw, self._to_torch) if len(hw) else []
        bad = [i for i, im in enumerate(imgs) if im is None]
        chw = [im.to(self.dtype) if im is not None else torch.zeros((3, h, w), dtype=self.dtype, device=self.torch_device)
               for im, (h, w) in zip(imgs, hw)]
        if not isinstance(self.policy, DynamicPolicy):
            s = self.policy.size
            pv = torch.stack(chw) if chw else torch.zeros((0, 3, s, s), dtype=self.dtype, device=self.torch_device)
            return DecodedImages(pv, None, None, bad)
        p = self.policy.patch
        grid = torch.tensor([[h // p, w // p] for h, w in hw], dtype=torch.int32).reshape(-1, 2)
        counts = grid[:, 0] * grid[:, 1]
        cu = torch.zeros(len(hw) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(counts, 0)
        pv = (torch.cat([patchify(x, p) for x in chw]) if chw
              else torch.zeros((0, 3 * p * p), dtype=self.dtype, device=self.torch_device))
        return DecodedImages(pv, grid.to(self.torch_device), cu.to(self.torch_device), bad)

    def __call__(self, batch: dict) -> dict:
        """Replace `image_bytes`/`image_sizes` by pixel fields on the device; drop loss of bad samples."""
        image_bytes = batch.pop("image_bytes")
        image_sizes = batch.pop("image_sizes")
        dec = self.decode(image_bytes, image_sizes)
        batch["pixel_values"] = dec.pixel_values
        if dec.image_grid is not None:
            batch["image_grid"] = dec.image_grid
            batch["vision_cu_seqlens"] = dec.vision_cu_seqlens
        if dec.bad:
            self._drop_bad(batch, dec.bad)
        return batch

    def _drop_bad(self, batch: dict, bad: list[int]) -> None:
        owners = image_owners(batch)
        samples = sorted({int(owners[i]) for i in bad}) if owners is not None else []
        if "labels" in batch and "cu_seqlens" in batch:
            cu = batch["cu_seqlens"]
            for s in samples:
                batch["labels"][int(cu[s]):int(cu[s + 1])] = -100
        n = len(samples) if owners is not None else len(bad)
        self.skipped[SKIP_REASON] += n
        stats = batch.get("stats")
        if isinstance(stats, dict):
            skipped = stats.setdefault("skipped", {})
            skipped[SKIP_REASON] = skipped.get(SKIP_REASON, 0) + n
            if "samples" in stats:
                stats["samples"] = max(0, stats["samples"] - n)
        keys = batch.get("sample_keys")
        batch["bad_samples"] = [keys[s] for s in samples] if keys is not None else samples


def image_owners(batch: dict) -> np.ndarray | None:
    """Index of the sample owning each image, from `image_counts` (images per sample), if present."""
    counts = batch.get("image_counts")
    if counts is None:
        return None
    counts = np.asarray(counts.cpu() if isinstance(counts, torch.Tensor) else counts, dtype=np.int64)
    return np.repeat(np.arange(len(counts)), counts)
