"""Idefics3 / SmolVLM image splitting (transformers' Idefics3ImageProcessor and SmolVLMImageProcessor; the same
rules): from an image's stored size alone, the tile grid and the token run its processor writes.

The processor resizes the longest edge to `size["longest_edge"]` (up or down; the other side
`int(long / aspect)`, made even), caps both sides at 4096, then (image splitting on) resizes again so
both sides are multiples of the tile side S = `max_image_size["longest_edge"]` (`ceil`) and cuts that
image into rows x cols S-px tiles, row by row, followed by the global image (that image resized to
S x S). An image whose second resize is S x S is not split: it is the global image alone. Without
splitting the image is resized (after the first resize) to S x S. Every resize is Pillow's, uint8,
with the folder's filter (LANCZOS by default), so the tiles are the processor's bit for bit.

The run replacing one `<image>` placeholder:

    split:   for each row: (<fake_token_around_image> <row_i_col_j> <image> x seq_len) per column, then "\\n";
             then "\\n" <fake_token_around_image> <global-img> <image> x seq_len <fake_token_around_image>
    single:  <fake_token_around_image> <global-img> <image> x seq_len <fake_token_around_image>

The text pieces inside it ("\\n" between rows, "\\n\\n" before the global image) are tokenized between
special tokens in the processor's full string, so their ids are fixed per tokenizer: the family
computes them once (`newline_ids`, `double_newline_ids`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from vlmdata.decode.tiled import TiledPolicy
from vlmdata.decode.tiling import grid_tiles

__all__ = ["MAX_IMAGE_SIDE", "Idefics3Policy", "POLICY", "split_grid"]

MAX_IMAGE_SIDE = 4096          # transformers' MAX_IMAGE_SIZE: no side past it after the first resize


def _first_resize(width, height, longest: int):
    """(w, h) after the processor's `resize` to `size["longest_edge"]` then below MAX_IMAGE_SIDE (vectorised)."""
    w = np.asarray(width, np.float64)
    h = np.asarray(height, np.float64)
    ratio = w / h
    wide = w >= h
    out_w = np.where(wide, float(longest), np.trunc(longest * ratio))
    out_h = np.where(wide, np.trunc(longest / ratio), float(longest))
    out_w = np.where(~wide & (out_w % 2 == 1), out_w + 1, out_w)
    out_h = np.where(wide & (out_h % 2 == 1), out_h + 1, out_h)
    out_w, out_h = np.maximum(out_w, 1), np.maximum(out_h, 1)
    ratio = out_w / out_h
    cap_w = (out_w >= out_h) & (out_w > MAX_IMAGE_SIDE)
    cap_h = (out_h > out_w) & (out_h > MAX_IMAGE_SIDE)
    capped_w = np.where(cap_w, float(MAX_IMAGE_SIDE), np.where(cap_h, np.trunc(MAX_IMAGE_SIDE * ratio), out_w))
    capped_h = np.where(cap_h, float(MAX_IMAGE_SIDE), np.where(cap_w, np.trunc(MAX_IMAGE_SIDE / ratio), out_h))
    return np.maximum(capped_w, 1), np.maximum(capped_h, 1)


def _encoder_resize(w, h, tile: int):
    """(w, h) after `resize_for_vision_encoder`: both sides multiples of `tile` (vectorised, float64 in and out)."""
    ratio = w / h
    wide = w >= h
    out_w = np.where(wide, np.ceil(w / tile) * tile, 0.0)
    out_h = np.where(wide, np.ceil(np.trunc(out_w / ratio) / tile) * tile, np.ceil(h / tile) * tile)
    out_w = np.where(wide, out_w, np.ceil(np.trunc(out_h * ratio) / tile) * tile)
    return out_w, out_h


def split_grid(width, height, longest: int, tile: int, split: bool):
    """(rows, cols) int64 of each image's tile grid (0, 0: not split), vectorised over sizes."""
    w, h = _first_resize(width, height, longest)
    if not split:
        zero = np.zeros(np.shape(w), np.int64)
        return zero, zero.copy()
    w, h = _encoder_resize(w, h, tile)
    cut = (h > tile) | (w > tile)
    return np.where(cut, h // tile, 0).astype(np.int64), np.where(cut, w // tile, 0).astype(np.int64)


@dataclass(frozen=True)
class Idefics3Policy(TiledPolicy):
    """Idefics3 / SmolVLM tiling; see the module docstring. `tile` = max_image_size, `merge` = the connector's
    scale factor, `seq_len` = image tokens per tile (image_seq_len), `longest_edge` = the first resize's size."""

    kind = "idefics3"
    seq_len: int = 169
    longest_edge: int = 4 * 364
    split: bool = True
    fake_token_id: int = 0                 # <fake_token_around_image>
    global_token_id: int = 0               # <global-img>
    row_col_ids: tuple = ()                # <row_i_col_j> for i, j = 1..grid_side, row-major
    grid_side: int = 6                     # rows and columns the tokenizer has <row_i_col_j> for
    newline_ids: tuple = ()                # "\n" between two special tokens
    double_newline_ids: tuple = ()         # "\n\n" between two special tokens

    def grid_of(self, width, height):
        return split_grid(width, height, self.longest_edge, self.tile, self.split)

    def tiles(self, width, height) -> np.ndarray:
        rows, cols = self.grid_of(width, height)
        return rows * cols + 1

    def tokens(self, width, height) -> np.ndarray:
        rows, cols = self.grid_of(width, height)
        single = self.seq_len + 3
        split = (rows * cols * (self.seq_len + 2) + (rows - 1) * len(self.newline_ids)
                 + len(self.double_newline_ids) + single)
        return np.where(rows > 0, split, single).astype(np.int64)

    def layout_key(self, width: int, height: int):
        rows, cols = self.grid_of(width, height)
        return int(rows), int(cols)

    def build_expansion(self, key) -> np.ndarray:
        rows, cols = key
        if rows > self.grid_side or cols > self.grid_side:
            raise ValueError(f"a {rows}x{cols} tile grid needs <row_{rows}_col_{cols}>, which the tokenizer lacks")
        image = [self.image_token_id] * self.seq_len
        run: list[int] = []
        for i in range(rows):
            for j in range(cols):
                run += [self.fake_token_id, self.row_col_ids[i * self.grid_side + j], *image]
            if i < rows - 1:
                run += self.newline_ids
        if rows:
            run += self.double_newline_ids
        return np.asarray(run + [self.fake_token_id, self.global_token_id, *image, self.fake_token_id], np.int64)

    def pixels(self, image: Image.Image, resample: int) -> np.ndarray:
        w, h = _first_resize(image.width, image.height, self.longest_edge)
        resized = image.resize((int(w), int(h)), resample)
        side = (self.tile, self.tile)
        if not self.split:
            return np.array(resized.resize(side, resample))[None]
        ew, eh = _encoder_resize(w, h, self.tile)
        resized = resized.resize((int(ew), int(eh)), resample)
        rows, cols = int(eh) // self.tile, int(ew) // self.tile
        if rows * cols == 1:
            return np.array(resized)[None]
        out = np.empty((rows * cols + 1, self.tile, self.tile, 3), np.uint8)
        grid_tiles(np.asarray(resized), rows, cols, out[:-1])
        out[-1] = np.asarray(resized.resize(side, resample))
        return out


POLICY = Idefics3Policy
