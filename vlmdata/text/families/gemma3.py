"""Gemma 3 (model_type gemma3, Gemma3Processor): `<start_of_turn>user ... <end_of_turn>` turns, the system
prompt folded into the first user turn, 256 soft tokens per image.

The chat template writes `<start_of_image>` for each image; Gemma3Processor replaces it with
"\\n\\n<start_of_image>" + `<image_soft_token>` x 256 + "<end_of_image>\\n\\n". The family
substitutes that text with ONE soft token (`placeholder_text`) before tokenizing, so the "\\n\\n" on
either side merges with the user's text exactly as in the processor's fully expanded text (the special
tokens split the text at the same places); the load-time policy (`decode.tiling.gemma3`) repeats the soft
token. Read from the folder: the token names (tokenizer_config `boi_token`/`eoi_token`/`image_token`),
the side and `resample` (preprocessor_config.json; bilinear by default, as Gemma3ImageProcessor), the
tokens per image (processor_config `image_seq_length`, config.json `mm_tokens_per_image`; they must
agree). Pan-and-scan (`do_pan_and_scan`) adds crops whose number depends on each image's size and text
("Here is the original image ... crops ...") that touches the user's text, which cannot be tokenized
before the image's size is known: such a folder is refused (transformers 5.24's Gemma3Processor applies it
only when called with do_pan_and_scan=True, whatever the folder says; its image processor alone applies the
folder's setting). Trained: each model reply and the
`<end_of_turn>` closing it.
"""
from __future__ import annotations

import math

from vlmdata.errors import ConfigError
from vlmdata.text.families.base import ModelFamily, VisionSpec

__all__ = ["Gemma3Family"]

IMAGENET_STANDARD = (0.5, 0.5, 0.5)


class Gemma3Family(ModelFamily):
    """Gemma 3 with pan-and-scan off (the published processor settings)."""

    name = "gemma3"
    model_types = ("gemma3",)
    processors = ("Gemma3Processor",)
    end_of_turn = ("<end_of_turn>",)

    def _named(self, key: str, default: str) -> str:
        extra = self.folder.tokenizer_config.get("extra_special_tokens")
        value = (extra if isinstance(extra, dict) else {}).get(key) or self.folder.tokenizer_config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        return value if isinstance(value, str) else default

    def _tokens_per_image(self) -> int:
        given = {int(v) for v in (self.folder.processor.get("image_seq_length"),
                                  self.folder.config.get("mm_tokens_per_image")) if v is not None}
        if len(given) > 1:
            raise ConfigError(f"{self.folder.path}: processor_config image_seq_length and config.json "
                              f"mm_tokens_per_image disagree: {sorted(given)}")
        return given.pop() if given else 256

    def vision_spec(self) -> VisionSpec:
        pp, cfg = self.folder.preprocessor, self.folder.config
        if pp.get("do_pan_and_scan"):
            raise ConfigError(f"{self.folder.path}: preprocessor_config.json sets do_pan_and_scan, which vlmdata's "
                              "gemma3 family does not support (its crops and text depend on each image's size); "
                              "set do_pan_and_scan to false or null (Gemma 3's published setting). Gemma3Processor "
                              "itself crops only when called with do_pan_and_scan=True (its default is False even "
                              "then), its image processor alone does crop")
        for flag in ("do_resize", "do_rescale", "do_normalize"):
            if pp.get(flag) is False:
                raise ConfigError(f"{self.folder.path}: preprocessor_config.json sets {flag}=false; vlmdata's gemma3 "
                                  "family follows the processor's resize, rescale and normalise steps")
        size = pp.get("size") if isinstance(pp.get("size"), dict) else {}
        side = int(size.get("height") or 896)
        if int(size.get("width") or side) != side:
            raise ConfigError(f"{self.folder.path}: Gemma 3 images are square; preprocessor_config.json size is {size}")
        vision_cfg = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else {}
        patch = int(vision_cfg.get("patch_size") or 14)
        tokens = self._tokens_per_image()
        per_side = math.isqrt(tokens)
        if per_side * per_side != tokens or (side // patch) % per_side:
            raise ConfigError(f"{self.folder.path}: {tokens} tokens per image do not pool a {side // patch}-patch "
                              "square grid (Gemma 3's projector needs a square number dividing it)")
        token = self._named("image_token", "<image_soft_token>")
        image_id = self.token_id(token)
        return VisionSpec(
            image_token=token, image_token_id=image_id,
            vision_start_id=self.token_id(self._named("boi_token", "<start_of_image>")),
            vision_end_id=self.token_id(self._named("eoi_token", "<end_of_image>")),
            patch_size=patch, merge_size=(side // patch) // per_side, temporal_patch_size=1,
            image_mean=tuple(pp.get("image_mean", IMAGENET_STANDARD)),
            image_std=tuple(pp.get("image_std", IMAGENET_STANDARD)),
            min_pixels=None, max_pixels=None, image_size=None, resample=int(pp.get("resample", 2)),
            policy={"kind": "gemma3", "tile": side, "patch": patch, "merge": (side // patch) // per_side,
                    "image_token_id": image_id, "tokens_per_image": tokens})

    def template_image_marker(self) -> str:
        return self._named("boi_token", "<start_of_image>")

    def placeholder_text(self) -> str:
        boi, eoi = self._named("boi_token", "<start_of_image>"), self._named("eoi_token", "<end_of_image>")
        return f"\n\n{boi}{self.vision.image_token}{eoi}\n\n"
