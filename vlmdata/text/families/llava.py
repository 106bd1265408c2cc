"""LLaVA-1.5 (model_type llava, LlavaProcessor): `USER: ... ASSISTANT: ...`, one `<image>` per image.

Each `<image>` becomes (image_size / patch)² tokens at load time (576 at 336 px,
patch 14: the CLIP grid plus its CLS token, minus the CLS token the "default"
feature strategy drops). The template's `{% generation %}` blocks are the
trained spans; the tokenizer adds `<s>` unless the text already starts with it.
"""
from __future__ import annotations

from vlmdata.errors import ConfigError
from vlmdata.text.families.base import ModelFamily, VisionSpec

__all__ = ["LlavaFamily"]


class LlavaFamily(ModelFamily):
    """LLaVA-1.5 with a fixed 336 px CLIP tower (anyres LLaVA-NeXT is another family)."""

    name = "llava"
    model_types = ("llava",)
    processors = ("LlavaProcessor",)

    def vision_spec(self) -> VisionSpec:
        pp, proc, cfg = self.folder.preprocessor, self.folder.processor, self.folder.config
        vision_cfg = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else {}
        patch = int(proc.get("patch_size") or vision_cfg.get("patch_size") or 14)
        crop = pp.get("crop_size")
        side = crop.get("height") if isinstance(crop, dict) else crop
        if side is None:
            size = pp.get("size")
            side = size.get("shortest_edge") if isinstance(size, dict) else size
        side = int(side or vision_cfg.get("image_size") or 336)
        strategy = proc.get("vision_feature_select_strategy") or cfg.get("vision_feature_select_strategy") or "default"
        extra = int(proc.get("num_additional_image_tokens", 1)) - (1 if strategy == "default" else 0)
        if extra != 0 or side % patch:
            raise ConfigError(f"{self.folder.path}: LLaVA with feature strategy {strategy!r}, {side} px and patch "
                              f"{patch} is not supported (vlmdata supports (size / patch)^2 image tokens)")
        token = proc.get("image_token") or "<image>"
        return VisionSpec(
            image_token=token, image_token_id=self.token_id(token), vision_start_id=None, vision_end_id=None,
            patch_size=patch, merge_size=1, temporal_patch_size=1,
            image_mean=tuple(pp.get("image_mean", (0.48145466, 0.4578275, 0.40821073))),
            image_std=tuple(pp.get("image_std", (0.26862954, 0.26130258, 0.27577711))),
            min_pixels=None, max_pixels=None, image_size=side, resample=int(pp.get("resample", 3)),
            policy={"kind": "fixed", "size": side, "patch": patch, "merge": 1})
