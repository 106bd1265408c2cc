"""LLaVA-OneVision's forward inputs from a pack of anyres tiles (`decode.tiling.llava_onevision`).

`LlavaOnevisionForConditionalGeneration.forward` takes, besides the ids, labels and boundaries:

- `pixel_values` [n_images, max_tiles, 3, S, S]: each image's tiles (base image first, then the grid
  row by row), normalised, zero after an image's last tile (the processor's `_pad_for_batching`;
  the model reads only an image's own tiles);
- `image_sizes` int64 [n_images, 2]: the ORIGINAL (height, width), from which the model finds the
  grid and removes the padding (the pack stores (width, height));
- `batch_num_images`: which images the model tiles. It tiles an image whose entry is 1 and gives
  one tile to each image of an entry of n > 1 (a sample with several images); only that
  flag per image matters, so consecutive one-tile images (of one sample or several) form one
  entry and every anyres image (always >= 2 tiles) an entry of 1.

The image token run itself is the image token repeated (the model inserts its newline feature).

Videos (`video.onevision_policy`): the pack's `pixel_values_videos` rows uint8 [frames, 3 * S * S] (one per
sampled frame, clip after clip) become the model's `pixel_values_videos` [videos, N, 3, S, S], normalised
with the image mean/std; every clip has the policy's N frames (`video_grid[:, 0]`), which the model needs
to stack them. Its video token run is `<video>` repeated (pooled frames, then one newline feature).
"""
from __future__ import annotations

import torch

from vlmdata.errors import AdapterError
from vlmdata.hf.adapter import TiledAdapter
from vlmdata.hf.pixels import video_patches

__all__ = ["LlavaOnevisionAdapter", "batch_num_images", "per_image_tiles", "video_frames"]


def batch_num_images(tiles: torch.Tensor) -> torch.Tensor:
    """The model's `batch_num_images` for images of these tile counts (see the module docstring)."""
    entries, run = [], 0
    for n in tiles.tolist() + [0]:                  # 0: the end
        if n == 1:
            run += 1
            continue
        if run == 1:
            raise AdapterError("a one-tile image stands alone between anyres images: LLaVA-OneVision would tile it "
                               "as a sample's only image")
        if run:
            entries.append(run)
            run = 0
        if n:
            entries.append(1)
    return torch.tensor(entries, dtype=torch.int64)


def per_image_tiles(pixels: torch.Tensor, tiles: torch.Tensor) -> torch.Tensor:
    """[tiles, 3, S, S] -> [n_images, max_tiles, 3, S, S], zero after each image's own tiles."""
    tiles = tiles.to(device=pixels.device, dtype=torch.int64)
    n, most = len(tiles), int(tiles.max())
    out = pixels.new_zeros((n, most, *pixels.shape[1:]))
    image = torch.repeat_interleave(torch.arange(n, device=pixels.device), tiles, output_size=pixels.shape[0])
    starts = torch.cumsum(tiles, 0) - tiles
    slot = torch.arange(pixels.shape[0], device=pixels.device) - starts[image]
    out[image, slot] = pixels
    return out


def video_frames(rows: torch.Tensor, frames: torch.Tensor, tile: int) -> torch.Tensor:
    """[sum frames, 3*S*S] -> [videos, N, 3, S, S]; AdapterError unless every clip has the same N frames."""
    counts = frames.to(torch.int64)
    if int(counts.sum()) != rows.shape[0] or rows.shape[1] != 3 * tile * tile:
        raise AdapterError(f"video_grid gives {int(counts.sum())} frames of 3x{tile}x{tile} but the pack has rows "
                           f"{list(rows.shape)}")
    if len(set(counts.tolist())) > 1:
        raise AdapterError(f"LLaVA-OneVision stacks a batch's clips: they need one frame count, got {counts.tolist()}")
    return rows.reshape(len(counts), int(counts[0]), 3, tile, tile)


class LlavaOnevisionAdapter(TiledAdapter):
    """LLaVA-OneVision: `pixel_values` per image, `image_sizes` (h, w), `batch_num_images`; 1-D positions."""

    family = ("llava-onevision",)

    def images(self, pack: dict) -> dict:
        out = super().images(pack)
        rows = pack.get("pixel_values_videos")
        if rows is not None and rows.shape[0]:
            if self.spec.video_token_id is None:
                raise AdapterError("the pack holds videos but the llava-onevision spec names no video_token_id")
            out["pixel_values_videos"] = rows
            out["video_frames"] = pack["video_grid"].to(torch.int64).reshape(-1, 3)[:, 0]
        return out

    def tile_keys(self, pack: dict) -> dict:
        tiles = pack["image_tiles"].to(torch.int64)
        return {"image_sizes": pack["image_sizes"].to(torch.int64).flip(-1),
                "batch_num_images": batch_num_images(tiles), "image_tiles": tiles}

    def finalize(self, batch: dict, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> dict:
        """TiledAdapter.finalize, then each image's tiles in a row of pixel_values and the clips' frames stacked
        (`image_tiles` and `video_frames` are not forward arguments: they stay here)."""
        tiles, frames = batch.get("image_tiles"), batch.get("video_frames")
        inputs = super().finalize({k: v for k, v in batch.items() if k not in ("image_tiles", "video_frames")},
                                  device, dtype)
        if "pixel_values_videos" in inputs:
            rows = video_patches(inputs["pixel_values_videos"], self.spec.image_mean, self.spec.image_std, dtype)
            inputs["pixel_values_videos"] = video_frames(rows, frames, int(self.spec.policy["tile"]))
        if "pixel_values" in inputs:
            if tiles is None:
                raise AdapterError("LLaVA-OneVision pixel_values without image_tiles: the pack lost its tile counts")
            inputs["pixel_values"] = per_image_tiles(inputs["pixel_values"], tiles)
        return inputs
