"""Qwen2-VL's 3-D M-RoPE position ids for a packed sequence, each sample computed as if it were alone.

Qwen2-VL (and Qwen2.5-VL and Qwen3-VL, for still images) rotate the language model's
queries and keys by three position ids per token, (temporal, height, width).
The model's rope-index rule, applied to one sample:

- text tokens take the running position p on all three axes, and p += 1;
- an image with an LLM grid (t, h, w) (the patch grid divided by the spatial
  merge) takes, for its token at (i, j, k) in raster order, (p + i, p + j, p + k);
  after it p += max(h, w);
- a video with an LLM grid (t, h, w) takes, for its token at (i, j, k), (p + floor(i * interval), p + j,
  p + k), interval = 1 for Qwen2-VL and tokens_per_second * second_per_grid_t for Qwen2.5-VL (in float32,
  as the model multiplies), then p += max(h, w) as for an image;
  Qwen3-VL's rope index instead takes each temporal patch as its own (1, h, w) grid (its `<t seconds>`
  timestamps are text between them): the caller passes those per-frame grids (`Qwen3VLAdapter`);
- p starts at 0.

In a pack every sample restarts at 0, exactly as if the model computed its
positions alone (`Qwen2VLModel.get_rope_index` on that sample), so a packed
sample is rotated as the same sample in a batch of one. The computation here
is vectorised over the whole pack (no Python loop over tokens or samples), in
integer torch ops, so it runs in the DataLoader workers.

Each image (video) must be one contiguous run of image (video) tokens inside one sample, with
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
                       image_token_id: int, merge_size: int, video_grid_thw: torch.Tensor | None = None,
                       video_token_id: int | None = None, video_interval: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [3, T] M-RoPE positions for a flat pack of T tokens (see the module docstring).

    input_ids: int [T]; cu_seqlens: int [n + 1] sample boundaries (0 ... T);
    image_grid_thw / video_grid_thw: int [k, 3] patch grid (t, h, w) of each image / video in pack order, or
    None; video_interval: float32 [v] temporal position step of each video (None: 1, Qwen2-VL).
    """
    ids = input_ids.reshape(-1)
    total = ids.numel()
    cu = cu_seqlens.to(device=ids.device, dtype=torch.int64)
    if cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != total or bool((cu[1:] < cu[:-1]).any()):
        raise AdapterError(f"cu_seqlens {cu.tolist()[:8]}... must rise from 0 to the pack's {total} tokens")
    if total == 0:
        return torch.zeros(3, 0, dtype=torch.int64, device=ids.device)
    inc = torch.ones(total, dtype=torch.int64, device=ids.device)
    offsets = []
    sample_of = sample_index(cu, total)
    kinds = [(image_token_id, image_grid_thw, None, "image")]
    if video_token_id is not None:
        kinds.append((video_token_id, video_grid_thw, video_interval, "video"))
    for token_id, grid_thw, interval, what in kinds:
        got = _vision_offsets(ids, token_id, _llm_grid(grid_thw, merge_size, ids.device), interval, what, sample_of)
        if got is not None:
            pos, off, last, step = got
            inc[ids == token_id] = 0
            inc[pos[last]] = step
            offsets.append((pos, off))
    start = torch.cumsum(inc, 0) - inc                           # running position before each token
    lengths = cu[1:] - cu[:-1]
    start = start - torch.repeat_interleave(start[cu[:-1].clamp(max=total - 1)], lengths, output_size=total)
    pos = start.unsqueeze(0).repeat(3, 1)
    for where, off in offsets:
        pos[:, where] += off
    return pos


def _vision_offsets(ids: torch.Tensor, token_id: int, grid: torch.Tensor, interval, what: str,
                    sample_of: torch.Tensor):
    """(token positions, their (t, h, w) offsets, index of each item's last token, position step per item)
    for one kind of vision token, or None when the pack has none."""
    is_vis = ids == token_id
    vis_pos = is_vis.nonzero(as_tuple=True)[0]
    n_tokens = vis_pos.numel()
    per_item = grid.prod(dim=1)
    if int(per_item.sum()) != n_tokens:
        raise AdapterError(f"the pack has {n_tokens} {what} tokens but its {len(grid)} {what}s take "
                           f"{int(per_item.sum())} (grids {grid.tolist()[:4]}...): the {what} policy and the "
                           "model's patch/merge sizes must agree")
    if not n_tokens:
        return None
    item_of = torch.repeat_interleave(torch.arange(len(grid), device=ids.device), per_item, output_size=n_tokens)
    first = torch.cumsum(per_item, 0) - per_item                 # index into vis_pos of each item's first token
    last = first + per_item - 1
    _check_runs(vis_pos, item_of, first, last, sample_of)
    local = torch.arange(n_tokens, device=ids.device) - first[item_of]
    h, w = grid[item_of, 1], grid[item_of, 2]
    t = local // (h * w)
    if interval is not None:
        step = interval.to(device=ids.device, dtype=torch.float32).reshape(-1)
        t = (t.to(torch.float32) * step[item_of]).long()       # the model's (arange(t) * interval).long()
    offsets = torch.stack([t, (local // w) % h, local % w])
    return vis_pos, offsets, last, torch.maximum(grid[:, 1], grid[:, 2])


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
    """Each image's (video's) tokens are contiguous and inside one sample."""
    if img_pos.numel() > 1:
        same = image_of[1:] == image_of[:-1]
        gaps = (img_pos[1:] - img_pos[:-1])[same]
        if bool((gaps != 1).any()):
            raise AdapterError("an image's tokens are split by other tokens: each image must be one run of "
                               "image tokens as long as its grid gives")
    if bool((sample_of[img_pos[first]] != sample_of[img_pos[last]]).any()):
        raise AdapterError("an image's tokens cross a sample boundary (cu_seqlens)")
