"""Qwen2-VL's 3-D M-RoPE position ids for a packed sequence, each sample computed as if it were alone.

Qwen2-VL (and Qwen2.5-VL and Qwen3-VL, for still images) rotate the language model's
queries and keys by three position ids per token, (temporal, height, width).
The model's rope-index rule, applied to one sample:

- text tokens take the running position p on all three axes, and p += 1;
- an image with an LLM grid (t, h, w) (the patch grid divided by the spatial
  merge) takes, for its token at (i, j, k) in raster order, (p + i, p + j, p + k);
  after it p += max(h, w);
- p starts at 0.

In a pack every sample restarts at 0, exactly as if the model computed its
positions alone (`Qwen2VLModel.get_rope_index` on that sample), so a packed
sample is rotated as the same sample in a batch of one. The computation here
is vectorised over the whole pack (no Python loop over tokens or samples), in
integer torch ops, so it runs in the DataLoader workers.

Each image must be one contiguous run of image tokens inside one sample, with
as many tokens as its grid gives (t*h*w / merge^2); anything else is an
`AdapterError`. Two images with no text token between them are laid out image
after image (the model's own 5.x rule would merge the runs; Qwen's chat layout
always separates images by <|vision_start|>/<|vision_end|>).
"""
from __future__ import annotations

import torch

from vlmdata.errors import AdapterError

__all__ = ["mrope_position_ids", "sample_index"]


def sample_index(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Which sample (segment of `cu_seqlens`) each of `total` tokens belongs to, int64 [total]."""
    cu = cu_seqlens.to(torch.int64)
    lengths = cu[1:] - cu[:-1]
    return torch.repeat_interleave(torch.arange(len(lengths), device=cu.device), lengths, output_size=total)


def mrope_position_ids(input_ids: torch.Tensor, cu_seqlens: torch.Tensor, image_grid_thw: torch.Tensor | None,
                       image_token_id: int, merge_size: int) -> torch.Tensor:
    """int64 [3, T] M-RoPE positions for a flat pack of T tokens (see the module docstring).

    input_ids: int [T]; cu_seqlens: int [n + 1] sample boundaries (0 ... T);
    image_grid_thw: int [k, 3] patch grid (t, h, w) of each image in pack order, or None.
    """
    ids = input_ids.reshape(-1)
    total = ids.numel()
    cu = cu_seqlens.to(device=ids.device, dtype=torch.int64)
    if cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != total or bool((cu[1:] < cu[:-1]).any()):
        raise AdapterError(f"cu_seqlens {cu.tolist()[:8]}... must rise from 0 to the pack's {total} tokens")
    if total == 0:
        return torch.zeros(3, 0, dtype=torch.int64, device=ids.device)
    is_img = ids == image_token_id
    inc = torch.ones(total, dtype=torch.int64, device=ids.device)
    img_pos = is_img.nonzero(as_tuple=True)[0]
    n_img_tokens = img_pos.numel()
    grid = _llm_grid(image_grid_thw, merge_size, ids.device)
    per_image = grid.prod(dim=1)
    if int(per_image.sum()) != n_img_tokens:
        raise AdapterError(f"the pack has {n_img_tokens} image tokens but its {len(grid)} images take "
                           f"{int(per_image.sum())} (grids {grid.tolist()[:4]}...): the image policy and the "
                           "model's patch/merge sizes must agree")
    offsets = None
    if n_img_tokens:
        image_of = torch.repeat_interleave(torch.arange(len(grid), device=ids.device), per_image,
                                           output_size=n_img_tokens)
        first = torch.cumsum(per_image, 0) - per_image          # index into img_pos of each image's first token
        last = first + per_image - 1
        _check_runs(img_pos, image_of, first, last, sample_index(cu, total))
        local = torch.arange(n_img_tokens, device=ids.device) - first[image_of]
        h, w = grid[image_of, 1], grid[image_of, 2]
        offsets = torch.stack([local // (h * w), (local // w) % h, local % w])
        inc[is_img] = 0
        inc[img_pos[last]] = torch.maximum(grid[:, 1], grid[:, 2])
    start = torch.cumsum(inc, 0) - inc                           # running position before each token
    lengths = cu[1:] - cu[:-1]
    start = start - torch.repeat_interleave(start[cu[:-1].clamp(max=total - 1)], lengths, output_size=total)
    pos = start.unsqueeze(0).repeat(3, 1)
    if offsets is not None:
        pos[:, img_pos] += offsets
    return pos


def _llm_grid(image_grid_thw: torch.Tensor | None, merge: int, device: torch.device) -> torch.Tensor:
    """(t, h / merge, w / merge) per image, int64 [k, 3]."""
    if image_grid_thw is None or image_grid_thw.numel() == 0:
        return torch.zeros(0, 3, dtype=torch.int64, device=device)
    grid = image_grid_thw.to(device=device, dtype=torch.int64).reshape(-1, 3)
    if bool((grid[:, 1:] % merge != 0).any()):
        raise AdapterError(f"image grids {grid.tolist()[:4]} are not multiples of the merge size {merge}")
    return torch.stack([grid[:, 0], grid[:, 1] // merge, grid[:, 2] // merge], dim=1)


def _check_runs(img_pos: torch.Tensor, image_of: torch.Tensor, first: torch.Tensor, last: torch.Tensor,
                sample_of: torch.Tensor) -> None:
    """Each image's tokens are contiguous and inside one sample."""
    if img_pos.numel() > 1:
        same = image_of[1:] == image_of[:-1]
        gaps = (img_pos[1:] - img_pos[:-1])[same]
        if bool((gaps != 1).any()):
            raise AdapterError("an image's tokens are split by other tokens: each image must be one run of "
                               "image tokens as long as its grid gives")
    if bool((sample_of[img_pos[first]] != sample_of[img_pos[last]]).any()):
        raise AdapterError("an image's tokens cross a sample boundary (cu_seqlens)")
