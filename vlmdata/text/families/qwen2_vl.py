"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL: ChatML turns, `<|vision_start|><|image_pad|><|vision_end|>` per image.

Each `<|image_pad|>` becomes (t·h·w) / merge² tokens at load time, with the image
resized by `smart_resize` (sides multiples of patch·merge, pixels within
[min_pixels, max_pixels]; `decode.policy.DynamicPolicy`), all read from the
folder's `preprocessor_config.json` (`min_pixels`/`max_pixels` override `size`,
as in transformers). Trained: each assistant reply and the `<|im_end|>` closing it.
Qwen3-VL differs only in its vision constants: patch 16 and mean/std 0.5 (its
processor is transformers' Qwen2VLImageProcessor with those numbers), which the
folder's preprocessor_config.json states; the family's defaults apply without it.

Videos: the template writes `<|vision_start|><|video_pad|><|vision_end|>`
per video item, one `<|video_pad|>` expanded at load time by the video policy
(`video.policy.VideoPolicy`), read from the folder's video_preprocessor_config.json (or the
`video_processor` entry of processor_config.json), else the generation's video processor defaults.
Qwen3-VL's placeholder expands to a `<t seconds>` timestamp, vision start, the frame's tokens and
vision end per temporal patch (`video.qwen3_policy.Qwen3VideoPolicy`).
"""
from __future__ import annotations

from functools import cached_property

from vlmdata.text.families.base import ModelFamily, VisionSpec
from vlmdata.video.policy import QWEN2_VL_VIDEO, VideoPolicy
from vlmdata.video.qwen3_policy import QWEN3_VL_VIDEO, Qwen3VideoPolicy
from vlmdata.video.timestamps import stamp_pieces

__all__ = ["Qwen2VLFamily", "Qwen25VLFamily", "Qwen3VLFamily"]

DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 28 * 28 * 1280
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class Qwen2VLFamily(ModelFamily):
    """Qwen2-VL (model_type qwen2_vl, Qwen2VLProcessor)."""

    name = "qwen2_vl"
    end_of_turn = ("<|im_end|>",)
    model_types = ("qwen2_vl",)
    processors = ("Qwen2VLProcessor",)
    image_processors = ("Qwen2VLImageProcessor",)
    default_patch = 14
    default_mean = CLIP_MEAN
    default_std = CLIP_STD
    encodes_video = True

    @property
    def video_token_id(self) -> int:
        return self.token_id("<|video_pad|>")

    def video_settings(self, patch: int, merge: int, defaults: dict) -> dict:
        """The policy fields both Qwen video processors share: the folder's settings over `defaults`."""
        vp = self.video_config()
        size = vp.get("size") if isinstance(vp.get("size"), dict) else {}
        d = defaults
        return dict(
            fps=float(vp.get("fps") or d["fps"]), min_frames=int(vp.get("min_frames") or d["min_frames"]),
            max_frames=int(vp.get("max_frames") or d["max_frames"]),
            temporal_patch=int(vp.get("temporal_patch_size") or d["temporal_patch"]),
            patch=int(vp.get("patch_size") or patch), merge=int(vp.get("merge_size") or merge),
            min_pixels=int(vp.get("min_pixels") or size.get("shortest_edge") or d["min_pixels"]),
            max_pixels=int(vp.get("max_pixels") or size.get("longest_edge") or d["max_pixels"]),
            resample=int(vp.get("resample", 3)))

    def video_policy(self, patch: int, merge: int) -> dict:
        """The video policy dict: the folder's video processor settings over Qwen2-VL's defaults."""
        return VideoPolicy(**self.video_settings(patch, merge, QWEN2_VL_VIDEO)).to_dict()

    def tokens_per_second(self, vision_cfg: dict) -> float | None:
        """Qwen2.5-VL's temporal M-RoPE scale (None: Qwen2-VL numbers a video's temporal patches 0, 1, ...)."""
        return None

    def document_video_text(self) -> str:
        return "<|vision_start|><|video_pad|><|vision_end|>"

    def vision_spec(self) -> VisionSpec:
        pp = self.folder.preprocessor
        size = pp.get("size") if isinstance(pp.get("size"), dict) else {}
        vision_cfg = self.folder.config.get("vision_config")
        vision_cfg = vision_cfg if isinstance(vision_cfg, dict) else {}
        patch = int(pp.get("patch_size") or vision_cfg.get("patch_size") or self.default_patch)
        merge = int(pp.get("merge_size") or vision_cfg.get("spatial_merge_size") or 2)
        min_px = int(pp.get("min_pixels") or size.get("shortest_edge") or size.get("min_pixels") or DEFAULT_MIN_PIXELS)
        max_px = int(pp.get("max_pixels") or size.get("longest_edge") or size.get("max_pixels") or DEFAULT_MAX_PIXELS)
        return VisionSpec(
            image_token="<|image_pad|>", image_token_id=self.token_id("<|image_pad|>"),
            vision_start_id=self.token_id("<|vision_start|>"), vision_end_id=self.token_id("<|vision_end|>"),
            patch_size=patch, merge_size=merge, temporal_patch_size=int(pp.get("temporal_patch_size", 2)),
            image_mean=tuple(pp.get("image_mean", self.default_mean)),
            image_std=tuple(pp.get("image_std", self.default_std)),
            min_pixels=min_px, max_pixels=max_px, image_size=None, resample=int(pp.get("resample", 3)),
            policy={"kind": "dynamic", "patch": patch, "merge": merge, "min_pixels": min_px, "max_pixels": max_px},
            video_policy=self.video_policy(patch, merge) if self.encodes_video else None,
            video_token_id=self.video_token_id if self.encodes_video else None,
            tokens_per_second=self.tokens_per_second(vision_cfg))

    def document_image_text(self) -> str:
        return "<|vision_start|><|image_pad|><|vision_end|>"

    def document_end(self) -> str | None:
        return "<|endoftext|>"


class Qwen25VLFamily(Qwen2VLFamily):
    """Qwen2.5-VL (model_type qwen2_5_vl, Qwen2_5_VLProcessor): the same text and image-token layout."""

    name = "qwen2_5_vl"
    model_types = ("qwen2_5_vl",)
    processors = ("Qwen2_5_VLProcessor",)
    image_processors = ()   # its folders name Qwen2VLImageProcessor: a bare one is Qwen2-VL's

    def tokens_per_second(self, vision_cfg: dict) -> float | None:
        return float(vision_cfg.get("tokens_per_second", 4))      # Qwen2_5_VLVisionConfig's default


class Qwen3VLFamily(Qwen2VLFamily):
    """Qwen3-VL (model_type qwen3_vl, Qwen3VLProcessor): Qwen2-VL's layout, patch 16, mean/std 0.5; videos
    with a `<t seconds>` timestamp per temporal patch (`video.qwen3_policy`)."""

    name = "qwen3_vl"
    model_types = ("qwen3_vl",)
    processors = ("Qwen3VLProcessor",)
    image_processors = ()
    default_patch = 16
    default_mean = (0.5, 0.5, 0.5)
    default_std = (0.5, 0.5, 0.5)

    @property
    def encodes_video(self) -> bool:
        """Videos are laid out when the tokenizer's timestamp ids compose from digit pieces (Qwen's do)."""
        return self.timestamp_pieces is not None

    @property
    def video_unsupported_reason(self) -> str | None:
        """Why this folder's videos are not laid out (None when they are)."""
        if self.encodes_video:
            return None
        return (f"the tokenizer of {self.folder.path} does not compose Qwen3-VL's `<t seconds>` timestamps from "
                "single digit pieces, so their ids cannot be counted before the frames are known")

    @cached_property
    def timestamp_pieces(self) -> dict | None:
        return stamp_pieces(lambda text: self.tokenizer.encode(text, add_special_tokens=False).ids)

    def video_policy(self, patch: int, merge: int) -> dict:
        """Qwen3VLVideoProcessor's settings (the folder's over its defaults) and the timestamp pieces."""
        vp = self.video_config()
        d = QWEN3_VL_VIDEO
        return Qwen3VideoPolicy(
            timestamp_pieces=self.timestamp_pieces, video_token_id=self.video_token_id,
            vision_start_id=self.token_id("<|vision_start|>"), vision_end_id=self.token_id("<|vision_end|>"),
            cap_pixels_per_frame=bool(vp.get("cap_pixels_per_frame") or False),
            max_video_tokens=int(vp.get("max_video_tokens") or d["max_video_tokens"]),
            **self.video_settings(patch, merge, d)).to_dict()
