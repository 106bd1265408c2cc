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
"""
from __future__ import annotations

import torch

from vlmdata.errors import AdapterError
from vlmdata.hf.adapter import TiledAdapter

__all__ = ["LlavaOnevisionAdapter", "batch_num_images", "per_image_tiles"]


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


class LlavaOnevisionAdapter(TiledAdapter):
    """LLaVA-OneVision: `pixel_values` per image, `image_sizes` (h, w), `batch_num_images`; 1-D positions."""

    family = ("llava-onevision",)

    def tile_keys(self, pack: dict) -> dict:
        tiles = pack["image_tiles"].to(torch.int64)
        return {"image_sizes": pack["image_sizes"].to(torch.int64).flip(-1),
                "batch_num_images": batch_num_images(tiles), "image_tiles": tiles}

    def finalize(self, batch: dict, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> dict:
        """TiledAdapter.finalize, then each image's tiles in a row of pixel_values (`image_tiles` is not a
        forward argument: it stays here)."""
        tiles = batch.get("image_tiles")
        inputs = super().finalize({k: v for k, v in batch.items() if k != "image_tiles"}, device, dtype)
        if "pixel_values" in inputs:
            if tiles is None:
                raise AdapterError("LLaVA-OneVision pixel_values without image_tiles: the pack lost its tile counts")
            inputs["pixel_values"] = per_image_tiles(inputs["pixel_values"], tiles)
        return inputs
