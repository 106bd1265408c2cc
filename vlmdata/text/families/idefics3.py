"""Idefics3 and SmolVLM (model_type idefics3 / smolvlm; Idefics3Processor / SmolVLMProcessor): `User:<image>...
<end_of_utterance>\\nAssistant: ...<end_of_utterance>\\n` turns, one `<image>` per image in the template.

The template writes `<image>`, the image token itself, so it is the shard-time placeholder; at load time
the `idefics3` image policy (`decode.tiling.idefics3`) replaces it with the processor's tile run
(`<fake_token_around_image>`, `<row_i_col_j>`, `<global-img>`, `<image>` x image_seq_len, the "\\n" pieces
between tile rows), from the stored width and height. Read from the folder: `preprocessor_config.json`'s
`size.longest_edge`, `max_image_size.longest_edge` (the tile side: 364, 384 or 512 by checkpoint),
`do_image_splitting`, `resample` (LANCZOS by default), mean/std (0.5); `processor_config.json`'s
`image_seq_len` (else from config.json: (image_size / patch)^2 / scale_factor^2). The two processors lay
images out alike; SmolVLM differs in its checkpoints' numbers and chat template (`<|im_start|>` first).
Trained: each assistant reply and the `<end_of_utterance>` closing it.
"""
from __future__ import annotations

import math

from vlmdata.decode.tiling.idefics3 import MAX_IMAGE_SIDE
from vlmdata.errors import ConfigError
from vlmdata.text.families.base import ModelFamily, VisionSpec

__all__ = ["Idefics3Family", "SmolVLMFamily"]

FAKE, GLOBAL, IMAGE = "<fake_token_around_image>", "<global-img>", "<image>"
DEFAULT_TILE = 364                 # the image processors' defaults (Idefics3ImageProcessor(Pil), SmolVLM's alike)
DEFAULT_SEQ_LEN = 169
LANCZOS = 1


def _longest(value, default: int) -> int:
    return int(value.get("longest_edge", default)) if isinstance(value, dict) else int(value or default)


class Idefics3Family(ModelFamily):
    """Idefics3 (model_type idefics3, Idefics3Processor); SmolVLM subclasses it."""

    name = "idefics3"
    model_types = ("idefics3",)
    processors = ("Idefics3Processor",)
    image_processors = ("Idefics3ImageProcessor",)   # and its Pil / Fast variants
    end_of_turn = ("<end_of_utterance>",)

    def seq_len(self) -> int:
        """Image tokens per tile: processor_config.json's image_seq_len, else the vision tower's count."""
        given = self.folder.processor.get("image_seq_len")
        if given is not None:
            return int(given)
        vision = self.folder.config.get("vision_config")
        if isinstance(vision, dict) and "image_size" in vision and "patch_size" in vision:
            scale = int(self.folder.config.get("scale_factor", 2))
            return int((int(vision["image_size"]) // int(vision["patch_size"])) ** 2 / scale ** 2)
        return DEFAULT_SEQ_LEN

    def _grid_side(self) -> int:
        """How many rows and columns of `<row_i_col_j>` tokens the tokenizer has."""
        side = 0
        while all(self.tokenizer.token_to_id(f"<row_{i}_col_{side + 1}>") is not None and
                  self.tokenizer.token_to_id(f"<row_{side + 1}_col_{i}>") is not None for i in range(1, side + 2)):
            side += 1
        return side

    def vision_spec(self) -> VisionSpec:
        pp, cfg = self.folder.preprocessor, self.folder.config
        if not pp.get("do_resize", True):
            raise ConfigError(f"{self.folder.path}: do_resize=false (tiles then depend on the original size without "
                              "bound) is not supported by vlmdata's idefics3 policy")
        tile = _longest(pp.get("max_image_size"), DEFAULT_TILE)
        longest = _longest(pp.get("size"), 4 * tile)
        split = bool(pp.get("do_image_splitting", True))
        if split and longest <= tile:
            raise ConfigError(f"{self.folder.path}: size.longest_edge {longest} <= max_image_size {tile}: images would "
                              "not be split into square tiles (vlmdata supports the checkpoints' longest_edge > tile)")
        side = self._grid_side()
        need = math.ceil(min(longest, MAX_IMAGE_SIDE) / tile) if split else 0
        if need > side:
            raise ConfigError(f"{self.folder.path}: images can be split into {need} x {need} tiles but the tokenizer "
                              f"has <row_i_col_j> tokens for {side} x {side}")
        vision = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else {}
        patch = int(vision.get("patch_size", 14))
        merge = int(cfg.get("scale_factor", 2))
        image_id = self.token_id(IMAGE)
        side = side if split else 0
        row_col = tuple(self.token_id(f"<row_{i}_col_{j}>") for i in range(1, side + 1) for j in range(1, side + 1))
        policy = {"kind": "idefics3", "tile": tile, "patch": patch, "merge": merge, "image_token_id": image_id,
                  "seq_len": self.seq_len(), "longest_edge": longest, "split": split,
                  "fake_token_id": self.token_id(FAKE), "global_token_id": self.token_id(GLOBAL),
                  "row_col_ids": row_col, "grid_side": side, "newline_ids": self.ids_between(FAKE, "\n", FAKE),
                  "double_newline_ids": self.ids_between(FAKE, "\n\n", FAKE)}
        return VisionSpec(
            image_token=IMAGE, image_token_id=image_id, vision_start_id=None, vision_end_id=None,
            patch_size=patch, merge_size=merge, temporal_patch_size=1,
            image_mean=tuple(pp.get("image_mean", (0.5, 0.5, 0.5))), image_std=tuple(pp.get("image_std", (0.5, 0.5, 0.5))),
            min_pixels=None, max_pixels=None, image_size=None, resample=int(pp.get("resample", LANCZOS)),
            policy=policy)


class SmolVLMFamily(Idefics3Family):
    """SmolVLM / SmolVLM2 (model_type smolvlm, SmolVLMProcessor): Idefics3's image layout."""

    name = "smolvlm"
    model_types = ("smolvlm",)
    processors = ("SmolVLMProcessor",)
    image_processors = ("SmolVLMImageProcessor",)
