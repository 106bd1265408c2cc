"""Qwen2-VL and Qwen2.5-VL: ChatML turns, `<|vision_start|><|image_pad|><|vision_end|>` per image.

Each `<|image_pad|>` becomes (t·h·w) / merge² tokens at load time, with the image
resized by `smart_resize` (sides multiples of patch·merge, pixels within
[min_pixels, max_pixels]; `decode.policy.DynamicPolicy`), all read from the
folder's `preprocessor_config.json` (`min_pixels`/`max_pixels` override `size`,
as in transformers). Trained: each assistant reply and the `<|im_end|>` closing it.
"""
from __future__ import annotations

from vlmdata.text.families.base import ModelFamily, VisionSpec
from vlmdata.text.model_folder import ModelFolder

__all__ = ["Qwen2VLFamily", "Qwen25VLFamily"]

DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 28 * 28 * 1280


class Qwen2VLFamily(ModelFamily):
    """Qwen2-VL (model_type qwen2_vl, Qwen2VLProcessor)."""

    name = "qwen2_vl"
    end_of_turn = ("<|im_end|>",)
    model_types = ("qwen2_vl",)
    processors = ("Qwen2VLProcessor",)

    @classmethod
    def matches(cls, folder: ModelFolder) -> bool:
        h = folder.hints()
        if h["model_type"] is not None:
            return h["model_type"] in cls.model_types
        if h["processor_class"] is not None:
            return h["processor_class"] in cls.processors
        return cls is Qwen2VLFamily and str(h["image_processor_type"] or "").startswith("Qwen2VLImageProcessor")

    def vision_spec(self) -> VisionSpec:
        pp = self.folder.preprocessor
        size = pp.get("size") if isinstance(pp.get("size"), dict) else {}
        patch = int(pp.get("patch_size", 14))
        merge = int(pp.get("merge_size", 2))
        min_px = int(pp.get("min_pixels") or size.get("shortest_edge") or size.get("min_pixels") or DEFAULT_MIN_PIXELS)
        max_px = int(pp.get("max_pixels") or size.get("longest_edge") or size.get("max_pixels") or DEFAULT_MAX_PIXELS)
        return VisionSpec(
            image_token="<|image_pad|>", image_token_id=self.token_id("<|image_pad|>"),
            vision_start_id=self.token_id("<|vision_start|>"), vision_end_id=self.token_id("<|vision_end|>"),
            patch_size=patch, merge_size=merge, temporal_patch_size=int(pp.get("temporal_patch_size", 2)),
            image_mean=tuple(pp.get("image_mean", (0.48145466, 0.4578275, 0.40821073))),
            image_std=tuple(pp.get("image_std", (0.26862954, 0.26130258, 0.27577711))),
            min_pixels=min_px, max_pixels=max_px, image_size=None, resample=int(pp.get("resample", 3)),
            policy={"kind": "dynamic", "patch": patch, "merge": merge, "min_pixels": min_px, "max_pixels": max_px})

    def document_image_text(self) -> str:
        return "<|vision_start|><|image_pad|><|vision_end|>"

    def document_end(self) -> str | None:
        return "<|endoftext|>"


class Qwen25VLFamily(Qwen2VLFamily):
    """Qwen2.5-VL (model_type qwen2_5_vl, Qwen2_5_VLProcessor): the same text and image-token layout."""

    name = "qwen2_5_vl"
    model_types = ("qwen2_5_vl",)
    processors = ("Qwen2_5_VLProcessor",)
