"""LLaVA-OneVision (model_type llava_onevision, LlavaOnevisionProcessor): ChatML turns, `<image>` per image.

Its chat template (the one transformers' conversion script gives the llava-hf checkpoints) writes
each message's images first, as `<image>\\n`, then its text; the processor repeats each `<image>`
by the image's feature count, so the stored text holds one `<image>` per image and the image
policy (`decode.tiling.llava_onevision`) expands it at load time: anyres tiles with the folder's
`image_grid_pinpoints` and the `anyres_max_N` cap for a sample's lone image, one tile each when a
sample holds several. The numbers come from `preprocessor_config.json` (tile size, pinpoints,
mean, resample), `processor_config.json` (`num_image_tokens`, `vision_aspect_ratio`, the feature
strategy) and `config.json` (the vision tower's patch and image size, the same settings); the
files must agree. Trained: the template's `{% generation %}` replies and the `<|im_end|>` closing each.

Videos: the template writes `<video>\\n` per video item (before the message's text, after its images); the
one `<video>` is expanded at load time by the video policy (`video.onevision_policy.OnevisionVideoPolicy`:
N uniform frames of the tile size, N * ceil(side / 2)² + 1 tokens), N read from the folder's
video_preprocessor_config.json (or the `video_processor` entry of processor_config.json). vlmdata
normalises frames with the image mean/std; a video config it cannot lay out (other mean/std, frames not
the tile, fps sampling) leaves images as they are and skips video rows as `video_unsupported`, with a warning.
"""
from __future__ import annotations

import math

from vlmdata.decode.tiling.llava_onevision import DEFAULT_PINPOINTS
from vlmdata.errors import ConfigError
from vlmdata.text.families.base import ModelFamily, VisionSpec
from vlmdata.text.families.tile_video import laid_out_or_warn, tile_video_settings
from vlmdata.video.onevision_policy import DEFAULT_NUM_FRAMES, OnevisionVideoPolicy

__all__ = ["LlavaOnevisionFamily"]

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)     # LlavaOnevisionImageProcessor's defaults
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class LlavaOnevisionFamily(ModelFamily):
    """LLaVA-OneVision (SigLIP tiles of 384 px, Qwen2 text model)."""

    name = "llava_onevision"
    model_types = ("llava_onevision",)
    processors = ("LlavaOnevisionProcessor",)
    image_processors = ("LlavaOnevisionImageProcessor",)
    end_of_turn = ("<|im_end|>",)

    @property
    def encodes_video(self) -> bool:
        """Videos are laid out unless the folder's video settings cannot be (then they are video_unsupported)."""
        vision = getattr(self, "vision", None)
        return vision is not None and vision.video_policy is not None

    @property
    def video_token_id(self) -> int:
        return self.token_id(self.folder.processor.get("video_token") or "<video>")

    def video_policy(self, tile: int, side: int, patch: int, mean: tuple, std: tuple) -> dict | None:
        """The video policy dict: `num_frames` from the folder's video settings (else DEFAULT_NUM_FRAMES); None,
        with a warning, for settings vlmdata cannot lay out (the images are not affected)."""
        def make() -> dict:
            num, resample = tile_video_settings(self.folder.path, self.video_config(), tile, mean, std,
                                                CLIP_MEAN, CLIP_STD)
            return OnevisionVideoPolicy(num_frames=num or DEFAULT_NUM_FRAMES, tile=tile, side=side, patch=patch,
                                        resample=resample).to_dict()

        return laid_out_or_warn(make, self)

    def document_video_text(self) -> str:
        return self.tokenizer.id_to_token(self.video_token_id)

    def _setting(self, name: str, *sources: dict, default=None):
        """The one value of `name` the files give (they must agree), else `default`."""
        given = [s[name] for s in sources if s.get(name) is not None]
        if any(g != given[0] for g in given[1:]):
            raise ConfigError(f"{self.folder.path}: the model files disagree on {name}: {given}")
        return given[0] if given else default

    def vision_spec(self) -> VisionSpec:
        pp, proc, cfg = self.folder.preprocessor, self.folder.processor, self.folder.config
        vision_cfg = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else {}
        size = pp.get("size") if isinstance(pp.get("size"), dict) else {}
        crop = pp.get("crop_size") if isinstance(pp.get("crop_size"), dict) else {}
        tile = int(crop.get("height") or size.get("height") or size.get("shortest_edge") or 384)
        patch = int(vision_cfg.get("patch_size") or 14)
        tower = int(vision_cfg.get("image_size") or tile)
        features = proc.get("num_image_tokens")
        side = math.isqrt(int(features)) if features else tower // patch
        pins = self._setting("image_grid_pinpoints", pp, cfg, default=[list(p) for p in DEFAULT_PINPOINTS])
        aspect = str(self._setting("vision_aspect_ratio", proc, cfg, default="anyres_max_9"))
        strategy = self._setting("vision_feature_select_strategy", proc, cfg, default="full")
        if not aspect.startswith("anyres_max_") or not aspect[len("anyres_max_"):].isdigit():
            raise ConfigError(f"{self.folder.path}: vision_aspect_ratio {aspect!r} is not supported (vlmdata "
                              "lays out LLaVA-OneVision's anyres_max_N)")
        if tower != tile or side != tile // patch:
            raise ConfigError(f"{self.folder.path}: {tile} px tiles, a {tower} px vision tower with patch {patch} "
                              f"and num_image_tokens {features} do not agree (LLaVA-OneVision: "
                              "sqrt(num_image_tokens) = image_size / patch, tiles of image_size)")
        mean, std = tuple(pp.get("image_mean", CLIP_MEAN)), tuple(pp.get("image_std", CLIP_STD))
        token = proc.get("image_token") or "<image>"
        video = self.video_policy(tile, side, patch, mean, std)
        policy = {"kind": "llava_onevision", "tile": tile, "patch": patch, "merge": 1,
                  "image_token_id": self.token_id(token), "side": side,
                  "pinpoints": [[int(a), int(b)] for a, b in pins], "max_patches": int(aspect[len("anyres_max_"):]),
                  "base": int(features or side * side) - (1 if strategy == "default" else 0),
                  "pad_color": [int(m * 255) for m in mean]}
        return VisionSpec(
            image_token=token, image_token_id=self.token_id(token), vision_start_id=None, vision_end_id=None,
            patch_size=patch, merge_size=1, temporal_patch_size=1, image_mean=mean,
            image_std=std, min_pixels=None, max_pixels=None, image_size=None,
            resample=int(pp.get("resample", 3)), policy=policy,
            video_policy=video, video_token_id=self.video_token_id if video else None)

    def document_end(self) -> str | None:
        return "<|endoftext|>" if self.tokenizer.token_to_id("<|endoftext|>") is not None else super().document_end()
