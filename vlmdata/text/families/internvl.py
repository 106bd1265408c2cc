"""InternVL3 / InternVL3.5 (model_type internvl, InternVLProcessor): ChatML turns, an image as
`<img>` + `<IMG_CONTEXT>` x (image_seq_length x tiles) + `</img>`.

The chat template writes `<IMG_CONTEXT>` for each image (the converted `-hf` folders' template:
`<IMG_CONTEXT>\\n`), which the processor replaces by `<img><IMG_CONTEXT>...<IMG_CONTEXT></img>`; vlmdata
stores `<img><IMG_CONTEXT></img>` (special tokens on both sides, so the text around tokenizes as the
processor's) and expands the one image token at load time by `decode.tiling.internvl.InternVLPolicy`:
dynamic 448 px tiling with the folder's `min_patches` / `max_patches`, a thumbnail when there is more
than one tile, `image_seq_length` tokens per tile. Read from `preprocessor_config.json` (size, min/max
patches, resample, mean/std), `processor_config.json` (image_seq_length) and `config.json`
(image_seq_length, image_token_id, the vision tower's image and patch size), which must agree.
Trained: each assistant reply and the `<|im_end|>` closing it.
"""
from __future__ import annotations

from vlmdata.errors import ConfigError
from vlmdata.text.families.base import ModelFamily, VisionSpec

__all__ = ["InternVLFamily"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _side(value) -> int | None:
    """One side of a square size given as an int, a [h, w] list or a {"height", "width"} dict."""
    if isinstance(value, dict):
        value = (value.get("height"), value.get("width"))
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise ConfigError(f"InternVL tiles are square; got a size of {list(value)}")
        value = value[0]
    return None if value is None else int(value)


class InternVLFamily(ModelFamily):
    """InternVL3 / InternVL3.5 as transformers lays them out (`InternVLForConditionalGeneration`)."""

    name = "internvl"
    end_of_turn = ("<|im_end|>",)
    model_types = ("internvl",)
    processors = ("InternVLProcessor",)

    def _named(self, key: str, default: str) -> str:
        """A token the processor takes from the tokenizer by name (`context_image_token`, ...)."""
        named = self.folder.tokenizer_config.get("extra_special_tokens")
        value = named.get(key) if isinstance(named, dict) else None
        return value if isinstance(value, str) else default

    def _agreed(self, what: str, *values) -> int | None:
        given = {int(v) for v in values if v is not None}
        if len(given) > 1:
            raise ConfigError(f"{self.folder.path}: the folder's files disagree on {what}: {sorted(given)}")
        return given.pop() if given else None

    def vision_spec(self) -> VisionSpec:
        pp, proc, cfg = self.folder.preprocessor, self.folder.processor, self.folder.config
        vision_cfg = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else {}
        token = self._named("context_image_token", "<IMG_CONTEXT>")
        image_id = self._agreed(f"the id of {token} (config.json image_token_id)", self.token_id(token),
                                cfg.get("image_token_id"))
        tile = self._agreed("the tile size", _side(pp.get("size")), _side(vision_cfg.get("image_size"))) or 448
        patch = _side(vision_cfg.get("patch_size")) or 14
        per_tile = self._agreed("image_seq_length", proc.get("image_seq_length"), cfg.get("image_seq_length")) or 256
        ratio = float(cfg.get("downsample_ratio", 0.5))
        if vision_cfg and per_tile != round((tile // patch) ** 2 * ratio ** 2):
            raise ConfigError(f"{self.folder.path}: image_seq_length {per_tile} is not (image_size / patch_size)^2 "
                              f"x downsample_ratio^2 = ({tile} / {patch})^2 x {ratio}^2")
        min_tiles, max_tiles = int(pp.get("min_patches", 1)), int(pp.get("max_patches", 12))
        return VisionSpec(
            image_token=token, image_token_id=image_id,
            vision_start_id=self.token_id(self._named("start_image_token", "<img>")),
            vision_end_id=self.token_id(self._named("end_image_token", "</img>")),
            patch_size=patch, merge_size=round(1 / ratio), temporal_patch_size=1,
            image_mean=tuple(pp.get("image_mean", IMAGENET_MEAN)), image_std=tuple(pp.get("image_std", IMAGENET_STD)),
            min_pixels=None, max_pixels=None, image_size=None, resample=int(pp.get("resample", 3)),
            policy={"kind": "internvl", "tile": tile, "patch": patch, "merge": round(1 / ratio),
                    "image_token_id": image_id, "per_tile": per_tile, "min_tiles": min_tiles,
                    "max_tiles": max_tiles})

    def template_image_marker(self) -> str | None:
        return self.vision.image_token

    def placeholder_text(self) -> str:
        start, end = (self.tokenizer.id_to_token(i) for i in (self.vision.vision_start_id, self.vision.vision_end_id))
        return f"{start}{self.vision.image_token}{end}"

    def document_end(self) -> str | None:
        return "<|endoftext|>"
