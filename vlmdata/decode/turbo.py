"""CPU JPEG decoding with libjpeg-turbo's TurboJPEG API (simplejpeg): DCT-scaled decode, then one resize.

libjpeg-turbo can decode a JPEG at n/8 of its size (n = 1..16) by shrinking the
inverse DCT, so a 1100 px photo headed for 336 px is decoded at 4/8 (551 px)
instead of full size, and the Pillow(-SIMD) resize to the exact target that
follows works on a small image. TurboJPEG also decodes faster than Pillow
(which goes row by row into its 4-byte pixel layout): a 640 px JPEG takes
about 1.0 ms where `Image.open().load()` takes 1.5 ms here.

Scales used: only n/8 with n in `FAST_SCALES` = (1, 2, 4, 8), picked by
Pillow's draft rule (`scale_for`; never below the target), so the pixels are
bit-identical to PillowDecoder's draft decode + resize (checked on the gen_raw
corpus at 56, 112, 336 px and dynamic resolution): the gain is TurboJPEG's
faster decode path, not a different image. Measured on this Xeon, 640 px JPEGs: 8/8 1.02 ms,
7/8 1.58, 6/8 1.33, 5/8 1.62, 4/8 0.84, 3/8 0.84: libjpeg-turbo has SIMD
inverse DCTs for 8/8, 4/8, 2/8 and 1/8 only, the 5/8-7/8 kernels are plain C
and slower than a full decode, which the cheaper resize after them does not
win back (whole decode+resize of 320-700 px images: simplejpeg's own smallest
n/8 choice 2.28-2.48 ms vs full decode 2.38-2.42 ms, within noise). 3/8 is as
fast as 4/8 and ~8 % cheaper overall on 800-1344 px images, but its error
against a full decode + resize is 3.7x that of 4/8 (mean |diff| 1.6 vs 0.44 on
a 1200x900 test scene, max 48 vs 14), so it is opt-in (`scales=`).
`fastdct` / `fastupsample` (libjpeg's "ifast" IDCT and nearest chroma
upsampling) are off by default: their gain was within the noise of this shared
machine (<= 5 %) and fastdct doubles the error at 4/8.

Everything that is not a plain YCbCr/greyscale JPEG (PNG, WebP, CMYK JPEGs, ...)
and every JPEG TurboJPEG rejects (or fails on with any exception) goes through
`PillowDecoder`, which then decides: a corrupt image comes back as None and is
counted once, as "corrupt_image", exactly as with Pillow alone. EXIF
orientation is read from the JPEG's APP1 segments (`vlmdata.orientation`)
and applied to the decoded array, so the output equals Pillow's displayed image. Decoding is strict, so a
truncated JPEG (which libjpeg would otherwise finish with grey rows and a
warning) is rejected, then rejected again by Pillow ("image file is truncated").
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
from PIL import Image

from vlmdata.decode.pillow import DEFAULT_MAX_PIXELS, PillowDecoder
from vlmdata.decode.policy import ImagePolicy
from vlmdata.errors import Skip
from vlmdata.orientation import apply_orientation, displayed_size, effective_orientation, read_orientation

FAST_SCALES = (1, 2, 4, 8)             # n of n/8: SIMD inverse DCTs (see the module docstring)
_TURBO_COLORSPACES = ("YCbCr", "Gray")  # decoded to RGB by TurboJPEG exactly like Pillow does


def turbo_available() -> bool:
    """True when simplejpeg (libjpeg-turbo's TurboJPEG) imports."""
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return False
    return True


def scale_for(width: int, height: int, tw: int, th: int, scales: tuple[int, ...] = FAST_SCALES) -> int:
    """The smallest n in `scales` with n/8 >= 1/r, r = min(width // tw, height // th); 8 if none.

    This is Pillow's draft rule (integer reduction factor), so the decoded size is never
    below the target and, with the default scales, equals what `Image.draft` would give.
    """
    r = min(width // max(1, tw), height // max(1, th))
    for n in sorted(scales):
        if n * r >= 8:
            return n
    return 8


class TurboDecoder:
    """The ImageDecoder for TurboJPEG (JPEG) with Pillow for everything else."""

    name = "turbo"

    def __init__(self, resample: str = "bilinear", max_pixels: int = DEFAULT_MAX_PIXELS,
                 fastdct: bool = False, fastupsample: bool = False, scales: tuple[int, ...] = FAST_SCALES):
        import simplejpeg

        if not scales or any(not 1 <= int(n) <= 8 for n in scales):
            raise ValueError(f"scales must be n of n/8 with 1 <= n <= 8, got {scales!r}")
        self.scales = tuple(sorted(int(n) for n in scales))

        self._jpeg = simplejpeg
        self.fallback = PillowDecoder(resample=resample, max_pixels=max_pixels)   # validates resample
        self.resample = self.fallback.resample
        self.max_pixels = int(max_pixels)
        self.fastdct = bool(fastdct)
        self.fastupsample = bool(fastupsample)
        self._errors: Counter = Counter()
        self.fallbacks = 0                      # images handed to Pillow (not JPEG, or rejected)

    def decode(self, images: list, sizes: list[tuple[int, int]], policy: ImagePolicy) -> list[np.ndarray | None]:
        """(H, W, 3) uint8 per image at policy.target_size, or None for a bad image."""
        return [self.decode_one(data, *policy.target_size(w, h)) for data, (w, h) in zip(images, sizes)]

    def decode_one(self, data, width: int, height: int) -> np.ndarray | None:
        """Decode one encoded image to (height, width, 3) uint8 as displayed, or None."""
        try:
            arr = self._turbo(data, width, height)
        except Exception:   # anything TurboJPEG or the resize raises: Pillow decides (and counts) instead
            arr = None
        if arr is None:
            self.fallbacks += 1
            return self.fallback.decode_one(data, width, height)
        if arr is False:
            return None
        return arr

    def _turbo(self, data, width: int, height: int):
        """The RGB array at (height, width); None = let Pillow handle it; False = rejected (counted)."""
        if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
            return None
        jpeg = self._jpeg
        try:
            h, w, colorspace, _ = jpeg.decode_jpeg_header(data)
        except ValueError:
            return None
        if colorspace not in _TURBO_COLORSPACES:
            return None
        if w * h > self.max_pixels:
            self._errors[Skip.IMAGE_TOO_LARGE] += 1
            return False
        orientation = effective_orientation(read_orientation(data), (w, h), (width, height))
        if orientation != 1:
            width, height = displayed_size(width, height, orientation)   # decode to the stored shape first
        n = scale_for(w, h, width, height, self.scales)
        sw, sh = math.ceil(w * n / 8), math.ceil(h * n / 8)
        exact = (sw, sh) == (width, height)
        try:
            # RGBX when a resize follows: Pillow maps a 4-byte-per-pixel buffer without a copy
            arr = jpeg.decode_jpeg(data, colorspace="RGB" if exact else "RGBX", fastdct=self.fastdct,
                                   fastupsample=self.fastupsample, min_width=sw, min_height=sh, strict=True)
        except ValueError:
            return None
        if arr.shape[:2] == (height, width):
            out = arr if arr.shape[2] == 3 else np.ascontiguousarray(arr[..., :3])
        else:
            img = Image.frombuffer("RGBX", (arr.shape[1], arr.shape[0]), arr, "raw", "RGBX", 0, 1)
            # packed straight from the resize's RGBX to RGB bytes: one copy less than convert("RGB") + asarray
            raw = img.resize((width, height), self.resample).tobytes("raw", "RGB")
            out = np.frombuffer(raw, np.uint8).reshape(height, width, 3)
        return apply_orientation(out, orientation)

    def pop_errors(self) -> Counter:
        """Reasons of the images rejected since the last call (Pillow fallback's included)."""
        out, self._errors = self._errors, Counter()
        out.update(self.fallback.pop_errors())
        return out
