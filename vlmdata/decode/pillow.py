"""CPU image decoding with Pillow (Pillow-SIMD when installed): JPEG draft mode, then one resize.

`img.draft("RGB", (tw, th))` lets libjpeg decode a big JPEG at 1/2, 1/4 or
1/8 scale (never below the target), which is most of the speed-up; the
resize to the policy's exact size follows (BILINEAR: Pillow's resize is
antialiased, i.e. a proper area filter when downscaling). Output is uint8 HWC:
no float work on CPU.

The output is the image as displayed, like stock Pillow's
`ImageOps.exif_transpose(img).convert("RGB")`: EXIF orientation applied
(after the resize, on the small image), palette/CMYK/16-bit/grey converted by
Pillow's own `convert("RGB")`, the first frame of an animation, ICC profiles
not applied (as `convert` does not).

Formats: those of `decode.probe.loader_formats()` (every Pillow plugin but
EPS), the same the shard gate checks with. Bad images (truncated, not an
image, unsupported) come back as None, and
images above `max_pixels` (decompression bombs) are rejected from the header
alone, before any pixel is decoded. No exception escapes `decode` (see
`decode.failures`). `pop_errors()` says why, per reason.
"""
from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
from PIL import Image

from vlmdata.decode.failures import failure_reason
from vlmdata.decode.policy import ImagePolicy
from vlmdata.decode.probe import open_image
from vlmdata.decode.tiled import is_tiled, sample_args
from vlmdata.errors import Skip
from vlmdata.orientation import displayed_size, effective_orientation, read_orientation

DEFAULT_MAX_PIXELS = 89_478_485      # Pillow's own default limit (about 0.25 GB of RGBA)
_FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
            "lanczos": Image.Resampling.LANCZOS}
TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
             5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
             8: Image.Transpose.ROTATE_90}   # Pillow's exif_transpose table


class PillowDecoder:
    """The ImageDecoder for Pillow."""

    name = "pillow"

    def __init__(self, resample: str = "bilinear", max_pixels: int = DEFAULT_MAX_PIXELS,
                 reducing_gap: float | None = None, draft: bool = True):
        if resample not in _FILTERS:
            raise ValueError(f"resample must be one of {sorted(_FILTERS)}, got {resample!r}")
        self.resample = _FILTERS[resample]
        self.max_pixels = int(max_pixels)
        self.reducing_gap = reducing_gap
        self.draft = draft
        self._errors: Counter = Counter()

    def decode(self, images: list, sizes: list[tuple[int, int]], policy: ImagePolicy,
               counts: list[int] | None = None) -> list[np.ndarray | None]:
        """(H, W, 3) uint8 per image at policy.target_size, or None for a bad image; a tiled policy's
        (n, S, S, 3) tiles per image (`decode.tiled`; `counts`: the image count of each image's sample,
        which a per_sample policy's tiles depend on, 1 when not given)."""
        if is_tiled(policy):
            counts = [1] * len(images) if counts is None else counts
            return [self._guarded(self._tiles, data, w, h, policy, *sample_args(policy, n))
                    for data, (w, h), n in zip(images, sizes, counts)]
        return [self.decode_one(data, *policy.target_size(w, h)) for data, (w, h) in zip(images, sizes)]

    def decode_one(self, data, width: int, height: int) -> np.ndarray | None:
        """Decode one encoded image to (height, width, 3) uint8 as displayed, or None (counted)."""
        return self._guarded(self._decode, data, width, height)

    def _guarded(self, step, *args):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")   # bomb warnings (checked below), palette transparency notes
                return step(*args)
        except Exception as exc:   # one image never ends the epoch: the reason is counted (decode.failures)
            self._errors[failure_reason(exc, self.name)] += 1
        return None

    def _decode(self, data, width: int, height: int) -> np.ndarray | None:
        return self._displayed(data, width, height, np.asarray)

    def _tiles(self, data, width: int, height: int, policy, *images: int) -> np.ndarray | None:
        """A tiled policy's tiles of the whole decoded image, made with this decoder's filter (fast mode)."""
        return self._displayed(data, width, height, lambda img: policy.pixels(img, int(self.resample), *images))

    def _displayed(self, data, width: int, height: int, finish):
        """`finish(image)` of the image as displayed at (width, height), RGB, while it is open; None
        (counted) for a decompression bomb."""
        with open_image(data) as img:
            if img.width * img.height > self.max_pixels:
                self._errors[Skip.IMAGE_TOO_LARGE] += 1
                return None
            if img.format == "TIFF":   # Pillow turns TIFFs itself when it loads them (size already displayed)
                orientation = 1
            else:
                orientation = effective_orientation(read_orientation(data), img.size, (width, height))
            stored = displayed_size(width, height, orientation)   # the target in stored pixels
            if self.draft and img.format == "JPEG":
                img.draft("RGB", stored)
            if img.mode != "RGB":
                img = img.convert("RGB")
            if img.size != stored:
                img = img.resize(stored, self.resample, reducing_gap=self.reducing_gap)
            else:
                img.load()
            if orientation in TRANSPOSE:
                img = img.transpose(TRANSPOSE[orientation])
            return finish(img)

    def pop_errors(self) -> Counter:
        """Reasons of the images rejected since the last call."""
        out, self._errors = self._errors, Counter()
        return out
