"""CPU image decoding with Pillow (Pillow-SIMD when installed): JPEG draft mode, then one resize.

`img.draft("RGB", (tw, th))` lets libjpeg decode a big JPEG at 1/2, 1/4 or
1/8 scale (never below the target), which is most of the speed-up; the
resize to the policy's exact size follows (BILINEAR: Pillow's resize is
antialiased, i.e. a proper area filter when downscaling). Output is uint8 HWC:
no float work on CPU.

Bad images (truncated, not an image, unsupported) come back as None, and
images above `max_pixels` (decompression bombs) are rejected from the header
alone, before any pixel is decoded. `pop_errors()` says why, per reason.
"""
from __future__ import annotations

import io
import warnings
from collections import Counter

import numpy as np
from PIL import Image

from vlmdata.decode.policy import ImagePolicy
from vlmdata.errors import Skip

DEFAULT_MAX_PIXELS = 89_478_485      # Pillow's own default limit (about 0.25 GB of RGBA)
_FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
            "lanczos": Image.Resampling.LANCZOS}


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

    def decode(self, images: list, sizes: list[tuple[int, int]], policy: ImagePolicy) -> list[np.ndarray | None]:
        """(H, W, 3) uint8 per image at policy.target_size, or None for a bad image."""
        return [self.decode_one(data, *policy.target_size(w, h)) for data, (w, h) in zip(images, sizes)]

    def decode_one(self, data, width: int, height: int) -> np.ndarray | None:
        """Decode one encoded image to (height, width, 3) uint8, or None."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                img = Image.open(io.BytesIO(data))
            with img:
                if img.width * img.height > self.max_pixels:
                    self._errors[Skip.IMAGE_TOO_LARGE] += 1
                    return None
                if self.draft and img.format == "JPEG":
                    img.draft("RGB", (width, height))
                if img.mode != "RGB":
                    img = img.convert("RGB")
                if img.size != (width, height):
                    img = img.resize((width, height), self.resample, reducing_gap=self.reducing_gap)
                else:
                    img.load()
                return np.asarray(img)
        except Image.DecompressionBombError:
            self._errors[Skip.IMAGE_TOO_LARGE] += 1
        except (OSError, SyntaxError, ValueError, Image.UnidentifiedImageError, EOFError):
            self._errors[Skip.CORRUPT_IMAGE] += 1
        return None

    def pop_errors(self) -> Counter:
        """Reasons of the images rejected since the last call."""
        out, self._errors = self._errors, Counter()
        return out
