"""Processor-exact decoding: the uint8 image a Hugging Face image processor resizes to, bit for bit.

The reference is what transformers does with an image file: `load_image` opens it with Pillow,
applies `ImageOps.exif_transpose` and `convert("RGB")`; the image processor's `convert_to_rgb`
composites what still has transparency onto white; the PIL backend resizes with the folder's
`resample` filter (Pillow's `resize`, uint8, no reducing gap), and CLIP-style processors (LLaVA)
resize the shortest side to the crop size (`int(size * long / short)` for the other side) and
centre-crop (`(h - crop) // 2`). This decoder does the same steps in the same order, in the same
library: full decode (no JPEG draft / DCT downscale), orientation before the resize, one resize.
The processor's rescale and normalisation are then `hf.pixels.normalize` (same float64/float32
arithmetic, as a lookup table), so `pixel_values` equal the processor's.

`decode.pillow.PillowDecoder` (draft decode, bilinear, orientation after the resize) is the fast
mode: it saves work when a JPEG is shrunk to half its sides or less; its pixels are close to the
processor's but not equal (tools/bench_exact_pixels.py measures both).
"""
from __future__ import annotations

import io

import numpy as np
from PIL import ExifTags, Image, ImageOps

from vlmdata.decode.pillow import DEFAULT_MAX_PIXELS, PillowDecoder
from vlmdata.errors import Skip

__all__ = ["PIXEL_MODES", "ExactDecoder", "check_pixels"]

PIXEL_MODES = ("exact", "fast")


def check_pixels(pixels: str) -> str:
    """`pixels` if it is a known mode, else ValueError naming the modes."""
    if pixels not in PIXEL_MODES:
        raise ValueError(f"pixels must be 'exact' (the processor's, bit for bit) or 'fast' (draft decode, "
                         f"bilinear), got {pixels!r}")
    return pixels


def processor_rgb(img: Image.Image) -> Image.Image:
    """`img` as transformers' load_image + convert_to_rgb leave it: EXIF orientation applied, RGB, leftover
    transparency (a palette's colour key) composited onto white. An upright RGB image is returned itself, not a
    copy: its pixels are those of the copies exif_transpose and convert would make."""
    if img.getexif().get(ExifTags.Base.Orientation, 1) not in (None, 1):
        img = ImageOps.exif_transpose(img)                    # else it copies the image unchanged
    if img.mode != "RGB":
        img = img.convert("RGB")                              # (an RGB image: a copy, the same pixels)
    if img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        img = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return img


def shortest_edge_size(width: int, height: int, side: int) -> tuple[int, int]:
    """(w, h) after resizing the shortest side to `side`, rounded as transformers does."""
    if width <= height:
        return side, int(side * height / width)
    return int(side * width / height), side


class ExactDecoder(PillowDecoder):
    """The ImageDecoder whose pixels are the image processor's (see the module docstring).

    `resample`: the PIL filter code from the folder's preprocessor_config.json (3 = bicubic, the
    Qwen2-VL, Qwen3-VL and CLIP processors' default). `crop`: resize the shortest side to the
    policy's size, then centre-crop (CLIP / LLaVA); else resize to the policy's size (Qwen).
    """

    name = "exact"

    def __init__(self, resample: int = 3, crop: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS):
        super().__init__(max_pixels=max_pixels, draft=False)
        self.resample = Image.Resampling(int(resample))
        self.crop = bool(crop)

    def _decode(self, data, width: int, height: int) -> np.ndarray | None:
        with Image.open(io.BytesIO(data)) as img:
            if img.width * img.height > self.max_pixels:
                self._errors[Skip.IMAGE_TOO_LARGE] += 1
                return None
            return self.from_image(img, width, height)

    def _tiles(self, data, width: int, height: int, policy, *images: int) -> np.ndarray | None:
        """A tiled policy's tiles, made from the full-resolution RGB image as its processor makes them."""
        with Image.open(io.BytesIO(data)) as img:
            if img.width * img.height > self.max_pixels:
                self._errors[Skip.IMAGE_TOO_LARGE] += 1
                return None
            return policy.pixels(processor_rgb(img), int(self.resample), *images)

    def from_image(self, img: Image.Image, width: int, height: int) -> np.ndarray:
        """An opened image (orientation not yet applied) -> (height, width, 3) uint8, as the processor resizes it."""
        img = processor_rgb(img)
        if not self.crop:
            return np.asarray(img.resize((width, height), self.resample))
        w, h = shortest_edge_size(img.width, img.height, min(width, height))
        img = img.resize((w, h), self.resample)
        top, left = (h - height) // 2, (w - width) // 2
        return np.ascontiguousarray(np.asarray(img)[top:top + height, left:left + width])
