"""DALI GPU stage: decode a pack's encoded images on the GPU, in the training process.

With `options.defer_decode=True` the dataset's workers ship encoded images
(`image_bytes`: list of bytes, `image_sizes`: int32 [n, 2] indexed (width,
height)) instead of pixels. `DaliGpuStage` decodes them with nvJPEG
(`fn.decoders.image(device="mixed")`), resizes each to the image policy's
target size, normalises on the device (mean/std, CHW float) and fills the
PackedBatch pixel fields as torch tensors on the GPU:

- fixed policy:   `pixel_values` [n_img, 3, S, S]
- dynamic policy: `pixel_values` [total_patches, 3*patch*patch] in the layout of
                  `decode.patches.flatten_patches`, `image_grid` int32 [n_img, 3] (t=1, rows, cols),
                  `vision_cu_seqlens` int32 [n_img + 1] (the collate layout, normalised floats)

Images DALI must not or cannot decode (GIF, TIFF, 16-bit PNG, anything it
fails on) are decoded by a `PillowDecoder` on the CPU instead, normalised the
same way and moved to the device (`decode.dali.routing`; counted in
`fallbacks`); EXIF orientation is applied on the device. A corrupt image (one
the CPU decoder rejects too) does not fail the pack: its pixels become zeros
(so every shape the planner counted stays the same), the sample that owns it
loses its loss (labels -100), and it is counted in
`batch["stats"]["skipped"]["corrupt_image"]`.

`device="cpu"` runs the same code on DALI's CPU backend (tests, GPU-less runs).
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from vlmdata.decode.dali.bad_samples import drop_samples
from vlmdata.decode.dali.cpu import note_fallback, target_hw
from vlmdata.decode.dali.pipeline import DaliConfig, DaliRunner, Normalization
from vlmdata.decode.dali.routing import plan_decode
from vlmdata.decode.pillow import PillowDecoder
from vlmdata.decode.policy import DynamicPolicy, ImagePolicy
from vlmdata.errors import Skip

log = logging.getLogger(__name__)

SKIP_REASON = Skip.CORRUPT_IMAGE


@dataclass(frozen=True)
class GpuStageOptions:
    """device: "mixed" (GPU decode) or "cpu"; dtype: torch dtype name of pixel_values.

    image_token_id: the tokenizer's IMAGE id, used to find which sample owns a corrupt
    image when the pack carries no `image_counts`.
    """

    device: str = "mixed"
    device_id: int = 0
    max_batch: int = 64
    num_threads: int = 2
    dtype: str = "bfloat16"
    interp: str = "linear"
    normalize: Normalization = field(default_factory=Normalization)
    image_token_id: int | None = None


@dataclass
class DecodedImages:
    """The decoded pixel fields of one pack, plus which inputs were bad."""

    pixel_values: torch.Tensor
    image_grid: torch.Tensor | None
    vision_cu_seqlens: torch.Tensor | None
    bad: list[int]


def patchify(img: torch.Tensor, patch: int, merge: int = 1) -> torch.Tensor:
    """[C, H, W] -> [gh*gw, C*patch*patch]: the layout of `vlmdata.decode.patches.flatten_patches`.

    Rows go merge-block by merge-block (each merge x merge block of neighbouring
    patches contiguous, blocks row-major), each row channel-major (C, py, px).
    Torch ops only, so it runs where the tensor lives (GPU).
    """
    c, h, w = img.shape
    gh, gw = h // patch, w // patch
    x = img.reshape(c, gh // merge, merge, patch, gw // merge, merge, patch)
    # (c, block row, row in block, py, block col, col in block, px) -> (br, bc, rib, cib, c, py, px)
    return x.permute(1, 4, 2, 5, 0, 3, 6).reshape(gh * gw, c * patch * patch)


def orient_chw(t: torch.Tensor, orientation: int) -> torch.Tensor:
    """A [C, H, W] tensor transformed like Pillow's `exif_transpose` (as `vlmdata.orientation.apply_orientation`)."""
    if orientation == 2:
        return t.flip(-1)
    if orientation == 3:
        return t.flip(-2, -1)
    if orientation == 4:
        return t.flip(-2)
    if orientation == 5:
        return t.transpose(-2, -1).contiguous()
    if orientation == 6:
        return torch.rot90(t, 3, dims=(-2, -1)).contiguous()
    if orientation == 7:
        return t.flip(-2, -1).transpose(-2, -1).contiguous()
    if orientation == 8:
        return torch.rot90(t, 1, dims=(-2, -1)).contiguous()
    return t


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
        self.cpu = PillowDecoder(resample="bicubic" if opt.interp == "cubic" else "bilinear")
        self.fallbacks: Counter = Counter()   # images decoded on the CPU instead: "format" or "dali_failed"
        self._norm = norm

    def _to_torch(self, t) -> torch.Tensor:
        from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

        out = torch.empty(t.shape(), dtype=to_torch_type[t.dtype], device=self.torch_device)
        stream = torch.cuda.current_stream(self.torch_device) if self.torch_device.type == "cuda" else None
        feed_ndarray(t, out, cuda_stream=stream)
        return out

    def _copied(self) -> None:
        """Wait for this run's async device copies before DALI may reuse (or free) its buffers."""
        if self.torch_device.type == "cuda":
            torch.cuda.current_stream(self.torch_device).synchronize()

    def decode(self, image_bytes: list, image_sizes) -> DecodedImages:
        """Decode and lay out one pack's images; `image_sizes` is [n, 2] (width, height) from the index."""
        sizes = np.asarray(image_sizes, dtype=np.int64).reshape(-1, 2)
        if len(image_bytes) != len(sizes):
            raise ValueError(f"{len(image_bytes)} images but {len(sizes)} sizes")
        hw = target_hw(self.policy, [tuple(s) for s in sizes.tolist()])
        imgs = self._decode_all(image_bytes, hw)
        bad = [i for i, im in enumerate(imgs) if im is None]
        chw = [im.to(self.dtype) if im is not None else torch.zeros((3, h, w), dtype=self.dtype, device=self.torch_device)
               for im, (h, w) in zip(imgs, hw)]
        if not isinstance(self.policy, DynamicPolicy):
            s = self.policy.size
            pv = torch.stack(chw) if chw else torch.zeros((0, 3, s, s), dtype=self.dtype, device=self.torch_device)
            return DecodedImages(pv, None, None, bad)
        p, m = self.policy.patch, self.policy.merge
        grid = torch.tensor([[1, h // p, w // p] for h, w in hw], dtype=torch.int32).reshape(-1, 3)
        counts = grid[:, 1] * grid[:, 2]
        cu = torch.zeros(len(hw) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(counts, 0)
        pv = (torch.cat([patchify(x, p, m) for x in chw]) if chw
              else torch.zeros((0, 3 * p * p), dtype=self.dtype, device=self.torch_device))
        return DecodedImages(pv, grid.to(self.torch_device), cu.to(self.torch_device), bad)

    def _decode_all(self, image_bytes: list, hw: list[tuple[int, int]]) -> list[torch.Tensor | None]:
        """DALI where it decodes right, the CPU decoder for the rest and for DALI's failures."""
        plan = plan_decode(image_bytes, hw)
        imgs: list[torch.Tensor | None] = [None] * len(hw)
        if plan.dali:
            got = self.runner.run([image_bytes[i] for i in plan.dali], plan.dali_hw, self._to_torch, self._copied,
                                  strict=False)
            for i, t in zip(plan.dali, got):
                imgs[i] = None if t is None else orient_chw(t, plan.orientation[i])
        failed = [i for i in plan.dali if imgs[i] is None]
        for why, idx in (("format", plan.cpu), ("dali_failed", failed)):
            for i in idx:
                note_fallback(self.fallbacks, why, i)
                h, w = hw[i]
                arr = self.cpu.decode_one(image_bytes[i], w, h)
                imgs[i] = None if arr is None else self._from_cpu(arr)
        self.cpu.pop_errors()   # the stage counts bad images itself, per sample
        return imgs

    def _from_cpu(self, arr: np.ndarray) -> torch.Tensor:
        """An (H, W, 3) uint8 CPU decode as DALI's output: [3, H, W] on the device, normalised like the pipeline."""
        t = torch.from_numpy(np.array(arr, dtype=np.uint8)).to(self.torch_device).permute(2, 0, 1).float()
        mean = torch.tensor(self._norm.mean, device=self.torch_device).reshape(3, 1, 1)
        std = torch.tensor(self._norm.std, device=self.torch_device).reshape(3, 1, 1)
        return (t - mean) / std

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
            self._drop_bad(batch, dec.bad, np.asarray(image_sizes, dtype=np.int64).reshape(-1, 2))
        return batch

    def _drop_bad(self, batch: dict, bad: list[int], sizes: np.ndarray) -> None:
        owners = image_owners(batch, self.policy, sizes, self.options.image_token_id)
        if owners is None:
            log.warning("pack has no image_counts and no image_token_id is configured: %d corrupt image(s) "
                        "zeroed but their samples keep their loss", len(bad))
        samples = sorted({int(owners[i]) for i in bad}) if owners is not None else []
        n = len(samples) if owners is not None else len(bad)
        self.skipped[SKIP_REASON] += n
        drop_samples(batch, samples, SKIP_REASON, n)


def _numpy(x) -> np.ndarray:
    return np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x, dtype=np.int64)


def image_owners(batch: dict, policy: ImagePolicy, sizes: np.ndarray, image_token_id: int | None) -> np.ndarray | None:
    """Index of the sample owning each image.

    From `image_counts` (images per sample) when the pack carries it; else from where each
    image's run of `image_token_id` tokens starts in `input_ids` (each image holds
    `policy.tokens(w, h)` consecutive tokens) and `cu_seqlens`. None when neither is known.
    """
    if "image_counts" in batch:
        counts = _numpy(batch["image_counts"])
        return np.repeat(np.arange(len(counts)), counts)
    if image_token_id is None or "input_ids" not in batch or "cu_seqlens" not in batch:
        return None
    positions = np.flatnonzero(_numpy(batch["input_ids"]) == image_token_id)
    per_image = np.asarray(policy.tokens(sizes[:, 0], sizes[:, 1]), dtype=np.int64).reshape(-1)
    firsts = np.concatenate([[0], np.cumsum(per_image)[:-1]]).astype(np.int64)
    if len(per_image) and int(per_image.sum()) != len(positions):
        raise ValueError(f"pack has {len(positions)} image tokens but its images need {int(per_image.sum())}")
    return np.searchsorted(_numpy(batch["cu_seqlens"]), positions[firsts], side="right") - 1
