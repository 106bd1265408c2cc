"""Gemma 3's image policy: every image resized to one `tile` x `tile` square (896 px), `tokens_per_image`
(256) soft tokens.

Gemma3ImageProcessor resizes the whole image to size x size with the folder's `resample` filter (no aspect
kept, no crop) and Gemma3Processor replaces the template's `<start_of_image>` with
"\\n\\n<start_of_image>" + `<image_soft_token>` x 256 + "<end_of_image>\\n\\n". The family keeps
that text with one soft token at shard time (`text.families.gemma3`), so the expansion here is only the
soft token repeated; the count does not depend on the image size. Pan-and-scan (extra crops whose number
depends on the size, with text around them) is refused by the family.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlmdata.decode.tiled import TiledPolicy

__all__ = ["POLICY", "Gemma3Policy"]


@dataclass(frozen=True)
class Gemma3Policy(TiledPolicy):
    """One square tile per image and `tokens_per_image` soft tokens (`merge`: the projector's pooling
    kernel, (tile / patch) / sqrt(tokens_per_image))."""

    kind = "gemma3"
    tile: int = 896
    patch: int = 14
    merge: int = 4
    tokens_per_image: int = 256

    def tokens(self, width, height) -> np.ndarray:
        return np.full(np.shape(width), self.tokens_per_image, dtype=np.int64)

    def tiles(self, width, height) -> np.ndarray:
        return np.ones(np.shape(width), dtype=np.int64)

    def layout_key(self, width: int, height: int) -> int:
        return 0

    def build_expansion(self, key) -> np.ndarray:
        return np.full(self.tokens_per_image, self.image_token_id, dtype=np.int64)

    def pixels(self, image, resample: int) -> np.ndarray:
        """The processor's one resize to tile x tile, as a (1, tile, tile, 3) uint8 array."""
        return np.asarray(image.resize((self.tile, self.tile), resample))[None]


POLICY = Gemma3Policy
