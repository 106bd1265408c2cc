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

Videos: the template writes `<video>\\n` per video item (the processor's `video_token`), which the processor
replaces by "Frame1: <img>...</img>\\nFrame2: <img>...</img>..." (`video.internvl_policy`). vlmdata renders it
as "Frame1: <img></img>", so "Frame1: " is tokenized with the text before it exactly as in the processor's
whole string (a byte-level BPE may merge across that boundary), and stores the `<img></img>` pair as one
placeholder id past the tokenizer's vocabulary (`video_token_id`; no text can produce it), which the video
policy expands at load time to the frames' ids from frame 1's `<img>` on. N (`num_frames`) comes from the
folder's video_preprocessor_config.json (or processor_config.json's `video_processor` entry), else
`DEFAULT_NUM_FRAMES`; a video config vlmdata cannot lay out (fps sampling, frames not the tile, mean/std not
the images', `initial_shift` other than the middle of each span) leaves images as they are and skips video
rows as `video_unsupported`, with a warning (`text.families.tile_video`).
"""
from __future__ import annotations

import numpy as np

from vlmdata.errors import ConfigError
from vlmdata.text.families.base import ModelFamily, VisionSpec, replace_marked
from vlmdata.text.families.tile_video import laid_out_or_warn, tile_video_settings
from vlmdata.text.families.tile_video import square_side as _side
from vlmdata.video.internvl_policy import DEFAULT_NUM_FRAMES, InternVLVideoPolicy, frame_prefix_texts

__all__ = ["InternVLFamily"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)     # InternVLVideoProcessor's defaults
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


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

    @property
    def encodes_video(self) -> bool:
        """Videos are laid out unless the folder's video settings cannot be (then they are video_unsupported)."""
        vision = getattr(self, "vision", None)
        return vision is not None and vision.video_policy is not None

    @property
    def video_token_id(self) -> int:
        """The stored placeholder of a clip: the first id past the tokenizer's vocabulary (module docstring)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def video_text(self) -> str:
        """What a video marker is rendered as: "Frame1: " and the empty image pair stored as the placeholder."""
        start, end = (self.tokenizer.id_to_token(i) for i in (self.vision.vision_start_id, self.vision.vision_end_id))
        return f"{frame_prefix_texts(1)[0]}{start}{end}"

    def video_policy(self, tile: int, per_tile: int, image_id: int, start: str, end: str, mean: tuple,
                     std: tuple, resample: int) -> dict | None:
        """InternVLVideoProcessor's settings as a video policy dict; None, with a warning, for settings vlmdata
        cannot lay out (the images are not affected)."""
        def make() -> dict:
            vp = self.video_config()
            if vp.get("initial_shift", True) is not True:
                raise ConfigError(f"{self.folder.path}: the video processor's initial_shift "
                                  f"{vp['initial_shift']!r} is not the middle of each span (True)")
            num, frame_resample = tile_video_settings(self.folder.path, vp, tile, mean, std, CLIP_MEAN, CLIP_STD)
            prefixes = tuple(self.ids_between(end, p, start) for p in frame_prefix_texts(num or DEFAULT_NUM_FRAMES))
            return InternVLVideoPolicy(prefix_ids=prefixes, image_token_id=image_id, start_id=self.token_id(start),
                                       end_id=self.token_id(end), per_tile=per_tile, tile=tile,
                                       resample=frame_resample if vp else resample).to_dict()

        return laid_out_or_warn(make, self)

    def render(self, conv):
        """The base rendering, with each video marker as `video_text()` (documents write it themselves)."""
        text, spans = super().render(conv)
        if conv.kind == "document" or not self.encodes_video:
            return text, spans
        return replace_marked(text, spans, self._named("video_token", "<video>"), self.video_text())

    def document_video_text(self) -> str:
        return self.video_text() if self.encodes_video else super().document_video_text()

    def stored_tokens(self, out: np.ndarray) -> np.ndarray:
        """Each `<img>` directly followed by `</img>` (a clip's; an image's pair holds its `<IMG_CONTEXT>`)
        stored as the one placeholder id: the pair's `</img>` dropped."""
        ids = out[0]
        pairs = np.flatnonzero((ids[:-1] == self.vision.vision_start_id) & (ids[1:] == self.vision.vision_end_id))
        if not len(pairs):
            return out
        out[0, pairs] = self.video_token_id
        return np.delete(out, pairs + 1, axis=1)

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
        start, end = self._named("start_image_token", "<img>"), self._named("end_image_token", "</img>")
        mean, std = tuple(pp.get("image_mean", IMAGENET_MEAN)), tuple(pp.get("image_std", IMAGENET_STD))
        video = self.video_policy(tile, per_tile, image_id, start, end, mean, std, int(pp.get("resample", 3)))
        return VisionSpec(
            image_token=token, image_token_id=image_id,
            vision_start_id=self.token_id(start), vision_end_id=self.token_id(end),
            patch_size=patch, merge_size=round(1 / ratio), temporal_patch_size=1,
            image_mean=mean, image_std=std,
            min_pixels=None, max_pixels=None, image_size=None, resample=int(pp.get("resample", 3)),
            policy={"kind": "internvl", "tile": tile, "patch": patch, "merge": round(1 / ratio),
                    "image_token_id": image_id, "per_tile": per_tile, "min_tiles": min_tiles,
                    "max_tiles": max_tiles},
            video_policy=video, video_token_id=self.video_token_id if video else None)

    def template_image_marker(self) -> str | None:
        return self.vision.image_token

    def placeholder_text(self) -> str:
        start, end = (self.tokenizer.id_to_token(i) for i in (self.vision.vision_start_id, self.vision.vision_end_id))
        return f"{start}{self.vision.image_token}{end}"

    def document_end(self) -> str | None:
        return "<|endoftext|>"
