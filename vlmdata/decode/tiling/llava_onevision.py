"""LLaVA-OneVision's anyres image policy (transformers' LlavaOnevisionProcessor and its image processor).

A sample with ONE image (the processor's single-image path):
- the best resolution among the folder's `image_grid_pinpoints` (`select_best_resolution`: most of
  the image kept, then least padding) takes the image resized keeping its aspect ratio (the other
  side `ceil`ed) and centred on black padding; it is cut into `tile` px squares, row by row, after
  the base image (the whole image squashed to tile x tile): tiles = 1 + rows x cols;
- its tokens are the base tile's (`base`: the processor's num_image_tokens, one less with the "default"
  feature strategy), plus the grid's `side` x `side` features per tile with the padding
  removed (the rounding of the model's `unpad_image`), one newline feature per remaining row, and,
  past `max_patches` tiles' worth of features (`anyres_max_9`, x 1.1), the features the model
  bilinearly shrinks them to: `int(h // ratio) * int(w // ratio)` plus `int(h // ratio)` newlines.

A sample with several images (the processor given one list of images per sample, as
`apply_chat_template` and LLaVA-OneVision's training do): each image is padded to a square with the
image mean's colour, resized to one tile, and costs `base` + 1 (its newline) tokens.

The features of each image are the image token repeated (the model inserts its newline embedding
itself). All from the stored width and height.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from PIL import Image

from vlmdata.decode.tiled import TiledPolicy
from vlmdata.decode.tiling import grid_tiles

__all__ = ["POLICY", "LlavaOnevisionPolicy", "best_resolution"]

# LlavaOnevisionImageProcessor's default pinpoints: 384 x {1..6} by 384 x {1..6}, as (height, width)
DEFAULT_PINPOINTS = tuple((384 * a, 384 * b) for a in range(1, 7) for b in range(1, 7))


def best_resolution(width, height, pinpoints) -> tuple[np.ndarray, np.ndarray]:
    """(best height, best width) per image: transformers' `select_best_resolution`, vectorised (the first
    pinpoint with the largest effective resolution, then the least waste), in cache-sized chunks."""
    ow = np.asarray(width, np.float64).reshape(-1)
    oh = np.asarray(height, np.float64).reshape(-1)
    pins = np.asarray(pinpoints, np.int64).reshape(-1, 2)
    best = np.zeros(len(ow), np.int64)
    for at in range(0, len(ow), _CHUNK):
        _best_chunk(ow[at:at + _CHUNK], oh[at:at + _CHUNK], pins, best[at:at + _CHUNK])
    return pins[best, 0], pins[best, 1]


_CHUNK = 1 << 14


def _best_chunk(ow: np.ndarray, oh: np.ndarray, pins: np.ndarray, out: np.ndarray) -> None:
    """`best_resolution` of one chunk, pinpoint by pinpoint, in Python's float64 arithmetic: the image
    scaled by min(pw / ow, ph / oh) and truncated is the smaller of the two scalings truncated (both
    monotone), so each distinct pinpoint side is divided and scaled once."""
    area = ow * oh
    by_w = {pw: (np.trunc(ow * (pw / ow)), np.trunc(oh * (pw / ow))) for pw in set(pins[:, 1].tolist())}
    by_h = {ph: (np.trunc(ow * (ph / oh)), np.trunc(oh * (ph / oh))) for ph in set(pins[:, 0].tolist())}
    best_key = np.full(len(ow), -np.inf)
    dw, dh = np.empty_like(ow), np.empty_like(ow)
    for i, (ph, pw) in enumerate(pins.tolist()):
        (ww, hw), (wh, hh) = by_w[pw], by_h[ph]
        np.minimum(ww, wh, out=dw)
        np.minimum(hw, hh, out=dh)
        np.multiply(dw, dh, out=dw)
        np.minimum(dw, area, out=dw)                       # effective resolution; then the least waste:
        np.multiply(dw, float((1 << 26) + 1), out=dh)      # eff * 2^26 - (ph * pw - eff), exact under 2^53
        np.subtract(dh, float(ph * pw), out=dh)
        better = dh > best_key                             # strict: the first of equal keys stays
        np.copyto(best_key, dh, where=better)
        out[better] = i


@dataclass(frozen=True)
class LlavaOnevisionPolicy(TiledPolicy):
    """LLaVA-OneVision's anyres tiling and token count (see the module docstring); `per_sample`: an image's
    layout depends on how many images its sample holds (`images`)."""

    kind: ClassVar[str] = "llava_onevision"
    per_sample: ClassVar[bool] = True
    tile: int = 384
    patch: int = 14
    side: int = 27                                  # features per tile side (sqrt(num_image_tokens))
    pinpoints: tuple = DEFAULT_PINPOINTS            # (height, width) resolutions, tile multiples
    max_patches: int = 9                            # anyres_max_N
    base: int = 729                                 # the base tile's tokens: num_image_tokens (- 1, "default")
    pad_color: tuple = (122, 116, 104)              # int(mean * 255): the multi-image square padding

    def __post_init__(self) -> None:
        bad = [p for p in self.pinpoints if p[0] % self.tile or p[1] % self.tile]
        if bad or not self.pinpoints:
            raise ValueError(f"LLaVA-OneVision pinpoints must be multiples of the {self.tile} px tile, got {bad}")

    # ---- counts ---------------------------------------------------------------------------------
    def _tile_grid(self, width, height) -> tuple[np.ndarray, np.ndarray]:
        bh, bw = best_resolution(width, height, self.pinpoints)
        return bh // self.tile, bw // self.tile

    def _single_tokens(self, width, height) -> np.ndarray:
        w = np.asarray(width, np.int64).reshape(-1)
        h = np.asarray(height, np.int64).reshape(-1)
        rows, cols = self._tile_grid(w, h)
        g = self.side
        cur_h, cur_w = rows * g, cols * g
        wider = w / h > cur_w / cur_h
        # the model's unpad_image: int(round(x, 7)) is floor(x + 5e-8) for these ratios (see tests)
        new_h = np.floor(h * (cur_w / w) + 5e-8).astype(np.int64)
        new_w = np.floor(w * (cur_h / h) + 5e-8).astype(np.int64)
        cur_h = np.where(wider, cur_h - (cur_h - new_h) // 2 * 2, cur_h)
        cur_w = np.where(wider, cur_w, cur_w - (cur_w - new_w) // 2 * 2)
        ratio = np.sqrt(cur_h * cur_w / (self.max_patches * g * g))
        big = ratio > 1.1
        safe = np.where(big, ratio, 1.0)
        small_h = np.floor_divide(cur_h, safe).astype(np.int64)
        small_w = np.floor_divide(cur_w, safe).astype(np.int64)
        feat_h = np.where(big, small_h, cur_h)
        feat_w = np.where(big, small_w, cur_w)
        return feat_h * feat_w + feat_h + self.base

    def tokens(self, width, height, images=None) -> np.ndarray:
        """Tokens per image, shaped as `width` (`images`: each image's sample's image count; None: alone)."""
        single = self._single_tokens(width, height)
        if images is not None:
            single = np.where(np.asarray(images).reshape(-1) == 1, single, self.base + 1)
        return single.reshape(np.shape(width))

    def tiles(self, width, height, images=None) -> np.ndarray:
        """Tiles per image, shaped as `width`: the base image plus the grid, or one for an image of several."""
        rows, cols = self._tile_grid(width, height)
        single = 1 + rows * cols
        if images is not None:
            single = np.where(np.asarray(images).reshape(-1) == 1, single, 1)
        return single.reshape(np.shape(width))

    def keep_images(self, total: int, kept: int) -> int:
        """How many of a truncated sample's `total` images it keeps when `kept` fit: never one alone of
        several (its one-tile layout would then be read as a single image's)."""
        return 0 if total > 1 and kept == 1 else kept

    # ---- ids ------------------------------------------------------------------------------------
    def layout_key(self, width: int, height: int, images: int = 1):
        return int(self.tokens([width], [height], [images])[0])

    def build_expansion(self, n: int) -> np.ndarray:
        return np.full(n, self.image_token_id, np.int64)

    # ---- pixels ---------------------------------------------------------------------------------
    def pixels(self, image: Image.Image, resample: int, images: int = 1) -> np.ndarray:
        """(tiles, tile, tile, 3) uint8 as LlavaOnevisionImageProcessor makes them from this RGB image."""
        t = self.tile
        if images != 1:
            return np.asarray(_square(image, self.pad_color).resize((t, t), resample))[None]
        bh, bw = (int(v[0]) for v in best_resolution([image.width], [image.height], self.pinpoints))
        nh, nw = _fit(image.height, image.width, bh, bw)
        canvas = np.zeros((bh, bw, 3), np.uint8)
        top, left = (bh - nh) // 2, (bw - nw) // 2
        canvas[top:top + nh, left:left + nw] = np.asarray(image.resize((nw, nh), resample))
        out = np.empty((1 + (bh // t) * (bw // t), t, t, 3), np.uint8)
        out[0] = np.asarray(image.resize((t, t), resample))
        grid_tiles(canvas, bh // t, bw // t, out=out[1:])
        return out


def _fit(height: int, width: int, target_h: int, target_w: int) -> tuple[int, int]:
    """transformers' get_patch_output_size: the side that limits fills the target, the other is ceiled."""
    import math

    scale_w, scale_h = target_w / width, target_h / height
    if scale_w < scale_h:
        return min(math.ceil(height * scale_w), target_h), target_w
    return target_h, min(math.ceil(width * scale_h), target_w)


def _square(image: Image.Image, color: tuple) -> Image.Image:
    """The processor's pad_to_square: the image centred on a square of its longest side, filled with `color`."""
    w, h = image.size
    if w == h:
        return image
    side = max(w, h)
    canvas = Image.new("RGB", (side, side), tuple(int(c) for c in color))
    canvas.paste(image, ((side - w) // 2, 0) if h == side else (0, (side - h) // 2))
    return canvas


POLICY = LlavaOnevisionPolicy
