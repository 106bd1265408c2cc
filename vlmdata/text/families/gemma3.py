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
agree).

Pan-and-scan: on when preprocessor_config.json sets `do_pan_and_scan` true; vlmdata then lays images out
as Gemma3Processor does when called with do_pan_and_scan=True (transformers 5.24 crops only then, whatever
the folder says, and with ITS defaults: min crop 256 px, at most 4 crops, ratio 1.2; a folder whose
pan_and_scan_* values differ from those is refused, since the processor and its image processor alone
would disagree). A folder with do_pan_and_scan false or null (Gemma 3's published setting) gets no crops,
as the processor called without it. An image with k crops is written "Here is the original image " + its
run + " and here are some crops to help you see better " + the crops' runs: the text before its
`<start_of_image>` touches the user's text, so the family writes it at shard time from the image's
stored size (`Conversation.image_sizes`, `image_texts`), and the policy expands the rest (the crops'
runs, between special tokens) at load time. Trained: each model reply and the
`<end_of_turn>` closing it.
"""
from __future__ import annotations

import math
from functools import cached_property

from vlmdata.errors import ConfigError
from vlmdata.text.chat_template import TemplateError
from vlmdata.text.conversation import Conversation
from vlmdata.text.families.base import ModelFamily, VisionSpec

__all__ = ["PAN_AND_SCAN_DEFAULTS", "Gemma3Family"]

IMAGENET_STANDARD = (0.5, 0.5, 0.5)
# Gemma3Processor.images_kwargs: what it crops with when called with do_pan_and_scan=True
PAN_AND_SCAN_DEFAULTS = {"pan_and_scan_min_crop_size": 256, "pan_and_scan_max_num_crops": 4,
                         "pan_and_scan_min_ratio_to_activate": 1.2}
ORIGINAL_INTRO = "Here is the original image "          # Gemma3Processor's text around a cropped image
CROPS_INTRO = " and here are some crops to help you see better "
CROPS_JOIN = " "


class Gemma3Family(ModelFamily):
    """Gemma 3; pan-and-scan when the folder enables it (see the module docstring)."""

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
        boi, eoi = self._named("boi_token", "<start_of_image>"), self._named("eoi_token", "<end_of_image>")
        return VisionSpec(
            image_token=token, image_token_id=image_id,
            vision_start_id=self.token_id(boi), vision_end_id=self.token_id(eoi),
            patch_size=patch, merge_size=(side // patch) // per_side, temporal_patch_size=1,
            image_mean=tuple(pp.get("image_mean", IMAGENET_STANDARD)),
            image_std=tuple(pp.get("image_std", IMAGENET_STANDARD)),
            min_pixels=None, max_pixels=None, image_size=None, resample=int(pp.get("resample", 2)),
            policy={"kind": "gemma3", "tile": side, "patch": patch, "merge": (side // patch) // per_side,
                    "image_token_id": image_id, "tokens_per_image": tokens, **self._pan_and_scan(boi, eoi)})

    def _pan_and_scan(self, boi: str, eoi: str) -> dict:
        """The policy's pan-and-scan fields: off, or Gemma3Processor's crop rule and the ids between runs (lists,
        as a manifest stores them)."""
        pp = self.folder.preprocessor
        if not pp.get("do_pan_and_scan"):
            return {"pan_and_scan": False}
        differ = {k: pp[k] for k, v in PAN_AND_SCAN_DEFAULTS.items() if pp.get(k) is not None and pp[k] != v}
        if differ:
            raise ConfigError(f"{self.folder.path}: preprocessor_config.json sets {differ}, but Gemma3Processor "
                              f"called with do_pan_and_scan=True crops with its own {PAN_AND_SCAN_DEFAULTS} "
                              "(its image processor alone would use the folder's): vlmdata follows the processor; "
                              "set them to null or to those values")
        return {"pan_and_scan": True, "min_crop_size": PAN_AND_SCAN_DEFAULTS["pan_and_scan_min_crop_size"],
                "max_crops": PAN_AND_SCAN_DEFAULTS["pan_and_scan_max_num_crops"],
                "min_ratio": PAN_AND_SCAN_DEFAULTS["pan_and_scan_min_ratio_to_activate"],
                "boi_token_id": self.token_id(boi), "eoi_token_id": self.token_id(eoi),
                "crops_intro_ids": list(self.ids_between(eoi, f"\n\n{CROPS_INTRO}\n\n", boi)),
                "between_crops_ids": list(self.ids_between(eoi, f"\n\n{CROPS_JOIN}\n\n", boi))}

    @cached_property
    def _policy(self):
        return self.vision.image_policy()

    def image_texts(self, conv: Conversation) -> list[str] | None:
        """With pan-and-scan, each image's text: "Here is the original image " before the placeholder of an
        image its stored size gives crops (the crops' runs follow in the load-time expansion)."""
        if not self._policy.pan_and_scan:
            return None
        if conv.image_sizes is None:
            raise ConfigError("the gemma3 family with pan-and-scan needs each image's width and height "
                              "(Conversation.image_sizes) to write its text")
        if len(conv.image_sizes) != conv.n_images:
            raise TemplateError(f"{len(conv.image_sizes)} image sizes for {conv.n_images} images")
        one = self.placeholder_text()
        if not conv.image_sizes:
            return []
        w, h = zip(*conv.image_sizes)
        return [ORIGINAL_INTRO + one if k else one for k in self._policy.crops(w, h).tolist()]

    def template_image_marker(self) -> str:
        return self._named("boi_token", "<start_of_image>")

    def placeholder_text(self) -> str:
        boi, eoi = self._named("boi_token", "<start_of_image>"), self._named("eoi_token", "<end_of_image>")
        return f"\n\n{boi}{self.vision.image_token}{eoi}\n\n"
