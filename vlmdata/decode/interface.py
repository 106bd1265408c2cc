"""The decoder interface shared by the TurboJPEG, Pillow and DALI-CPU decoders."""
from __future__ import annotations

from collections import Counter
from typing import Protocol

import numpy as np

from vlmdata.decode.policy import ImagePolicy


class ImageDecoder(Protocol):
    """Decodes encoded images and resizes each to the policy's target size.

    `decode` returns, per input image, an (H, W, 3) uint8 array of size
    `policy.target_size(width, height)` (width/height from the index: displayed
    sizes), showing what Pillow's `ImageOps.exif_transpose(img).convert("RGB")`
    shows, or None when that image is corrupt. No exception raised while decoding
    one image escapes it (`decode.failures`).
    """

    name: str

    def decode(self, images: list, sizes: list[tuple[int, int]], policy: ImagePolicy) -> list[np.ndarray | None]:
        ...

    def pop_errors(self) -> Counter:
        """Images returned as None since the last call, counted by skip reason; resets the counts."""
        ...
