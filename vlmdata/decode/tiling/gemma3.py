"""Gemma 3's image policy: every image resized to one `tile` x `tile` square (896 px), `tokens_per_image`
(256) soft tokens; with pan-and-scan, that image followed by its crops, each resized alike.

Gemma3ImageProcessor resizes the whole image to size x size with the folder's `resample` filter (no aspect
kept, no crop) and Gemma3Processor replaces the template's `<start_of_image>` with
"\\n\\n<start_of_image>" + `<image_soft_token>` x 256 + "<end_of_image>\\n\\n". The family keeps
that text with one soft token at shard time (`text.families.gemma3`), so without pan-and-scan the
expansion here is only the soft token repeated and the count does not depend on the image size.

Pan-and-scan (`pan_and_scan`: Gemma3Processor called with do_pan_and_scan=True) cuts an image whose long
side is at least `min_ratio` times its short side into k = 2..`max_crops` equal strips along the long
side (k = round(ratio) capped by long side // `min_crop_size`; none when a strip's short side would be
under `min_crop_size`), from the stored width and height alone (`pan_and_scan_crops`). The processor
then writes "Here is the original image " + the image's run + " and here are some crops to help you
see better " + the k crops' runs joined by " ". The family writes the text before the first
`<start_of_image>` at shard time (it merges with the user's text); the expansion of the first soft
token here continues the run through every crop: `<end_of_image>` + the fixed ids between two special
tokens (`crops_intro_ids`, then `between_crops_ids`) + `<start_of_image>` + 256 soft tokens, per crop;
the shard-time text's own `<end_of_image>` closes the last crop. Pixels: the original, then each crop
(the image's pixels sliced as the processor slices its array, the last strip shorter when the side does
not divide), each resized to tile x tile.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlmdata.decode.tiled import TiledPolicy

__all__ = ["POLICY", "Gemma3Policy", "crop_boxes", "pan_and_scan_crops"]


def pan_and_scan_crops(width, height, min_crop_size: int = 256, max_crops: int = 4,
                       min_ratio: float = 1.2) -> np.ndarray:
    """int64 number of pan-and-scan crops of each (width, height) (0: not cropped), vectorised; the rule
    of Gemma3ImageProcessor.pan_and_scan, in the same float64 arithmetic."""
    w = np.asarray(width, np.float64)
    h = np.asarray(height, np.float64)
    long, short = np.maximum(w, h), np.minimum(w, h)
    k = np.minimum(np.floor(long / short + 0.5), np.floor(long / min_crop_size))
    k = np.minimum(np.maximum(k, 2), max_crops)
    strip = np.ceil(long / k)                       # the crops' long side; their short side is the image's
    on = (long / short >= min_ratio) & (np.minimum(strip, short) >= min_crop_size)
    return np.where(on, k, 0).astype(np.int64)


def crop_boxes(width: int, height: int, crops: int) -> list[tuple[int, int, int, int]]:
    """(left, top, right, bottom) of each of an image's `crops` strips, in the processor's order, clipped to
    the image as its array slicing clips them."""
    if not crops:
        return []
    wide = width >= height
    step = -(-(width if wide else height) // crops)
    out = []
    for i in range(crops):
        a = i * step
        out.append((a, 0, min(a + step, width), height) if wide else (0, a, width, min(a + step, height)))
    return out


@dataclass(frozen=True)
class Gemma3Policy(TiledPolicy):
    """One square tile per image and `tokens_per_image` soft tokens (`merge`: the projector's pooling
    kernel, (tile / patch) / sqrt(tokens_per_image)); with `pan_and_scan`, one more tile and soft-token run
    per crop (see the module docstring)."""

    kind = "gemma3"
    tile: int = 896
    patch: int = 14
    merge: int = 4
    tokens_per_image: int = 256
    pan_and_scan: bool = False
    min_crop_size: int = 256
    max_crops: int = 4
    min_ratio: float = 1.2
    boi_token_id: int = 0                 # <start_of_image>
    eoi_token_id: int = 0                 # <end_of_image>
    crops_intro_ids: tuple = ()           # "\n\n and here are some crops to help you see better \n\n" between them
    between_crops_ids: tuple = ()         # "\n\n \n\n" between two crops' runs

    def crops(self, width, height) -> np.ndarray:
        if not self.pan_and_scan:
            return np.zeros(np.shape(width), dtype=np.int64)
        return pan_and_scan_crops(width, height, self.min_crop_size, self.max_crops, self.min_ratio)

    def tokens(self, width, height) -> np.ndarray:
        k = self.crops(width, height)
        joins = np.where(k > 0, len(self.crops_intro_ids) + (k - 1) * len(self.between_crops_ids), 0)
        return self.tokens_per_image + k * (self.tokens_per_image + 2) + joins

    def tiles(self, width, height) -> np.ndarray:
        return 1 + self.crops(width, height)

    def layout_key(self, width: int, height: int) -> int:
        return int(self.crops(width, height))

    def build_expansion(self, key) -> np.ndarray:
        run = [self.image_token_id] * self.tokens_per_image
        out = list(run)
        for j in range(key):
            out += [self.eoi_token_id, *(self.between_crops_ids if j else self.crops_intro_ids),
                    self.boi_token_id, *run]
        return np.asarray(out, dtype=np.int64)

    def pixels(self, image, resample: int) -> np.ndarray:
        """The processor's resize of the image, then of each crop, to tile x tile: (1 + crops, tile, tile, 3)
        uint8."""
        side = (self.tile, self.tile)
        boxes = crop_boxes(image.width, image.height, self.layout_key(image.width, image.height))
        out = np.empty((1 + len(boxes), self.tile, self.tile, 3), np.uint8)
        out[0] = np.asarray(image.resize(side, resample))
        for i, box in enumerate(boxes, 1):
            out[i] = np.asarray(image.crop(box).resize(side, resample))
        return out


POLICY = Gemma3Policy
