"""What an output adapter needs to know about a Hugging Face model family, read from a model folder.

`ModelSpec` is a small frozen record: the family, the image token, the pixel
normalisation and the patch geometry of the vision tower, and the image-size
rule of the model's processor (so the dataset's image policy gives exactly the
image tokens the model expects). `ModelSpec.from_folder(DIR)` builds it from
the files of a model or processor folder:

- `config.json`: `model_type` (the family), `image_token_id` (or LLaVA's older
  `image_token_index`), `vision_start_token_id` (Qwen), the vocabulary size
  (top level, or `text_config`), the vision tower's `patch_size`,
  `spatial_merge_size`, `temporal_patch_size`, `image_size` (LLaVA), and LLaVA's
  `vision_feature_select_strategy`;
- `preprocessor_config.json`, when present: `image_mean`, `image_std`,
  `patch_size`, `merge_size`, `temporal_patch_size`, `min_pixels`/`max_pixels`
  (or `size.shortest_edge`/`size.longest_edge`), LLaVA's `crop_size`. Without it
  (a config-only folder for a randomly initialised model) the family's processor
  defaults apply, the values transformers' image processor would use.

Values that config.json and preprocessor_config.json both give must agree; a
folder the adapters cannot serve (another family, a LLaVA whose image features
keep the CLS token) is a `ConfigError` that says why.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, replace

from vlmdata.decode.policy import DynamicPolicy, FixedPolicy, ImagePolicy, make_policy
from vlmdata.decode.tiled import is_tiled
from vlmdata.errors import ConfigError
from vlmdata.text.model_folder import read_model_file

__all__ = ["FAMILIES", "OPENAI_CLIP_MEAN", "OPENAI_CLIP_STD", "ModelSpec"]

log = logging.getLogger(__name__)

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# config.json model_type -> family name
FAMILIES = {"qwen2_vl": "qwen2-vl", "qwen2_5_vl": "qwen2.5-vl", "qwen3_vl": "qwen3-vl", "llava": "llava",
            "gemma3": "gemma3", "internvl": "internvl", "idefics3": "idefics3", "smolvlm": "smolvlm",
            "llava_onevision": "llava-onevision",
            "generic": "generic"}   # generic: any processor transformers knows (text.families.generic)
QWEN_FAMILIES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl")

# the processors' defaults (transformers' Qwen2VLImageProcessor and LLaVA-1.5's CLIP processor); Qwen3-VL's
# vision tower takes patch 16 and mean/std 0.5 (its preprocessor_config.json says so; these apply without one)
_QWEN_DEFAULTS = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2,
                  "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280}
_FAMILY_DEFAULTS = {"qwen3-vl": {"patch_size": 16, "image_mean": (0.5,) * 3, "image_std": (0.5,) * 3}}


@dataclass(frozen=True)
class ModelSpec:
    """The model-family facts the adapters use (see the module docstring for where each comes from).

    family: "qwen2-vl", "qwen2.5-vl", "qwen3-vl", "llava" or "gemma3".
    image_mean / image_std: per channel, 0-1 scale, as in preprocessor_config.json.
    patch_size / merge_size / temporal_patch_size: the vision tower's patch geometry (1, 1 for LLaVA's
        merge and temporal axes).
    min_pixels / max_pixels: Qwen's dynamic-resolution bounds; image_size: LLaVA's square input side.
    policy: a tiled family's image policy dict (InternVL, Idefics3, ...: `decode.tiled`); such a spec
        is read from the processor folder's tokenizer too, as the policy names token ids.
    vocab_size: the text model's embedding rows (None when the folder does not say).
    sliding_window: the text model's sliding-window span (config.json text_config.sliding_window, or the
        model's config through `HFBatchAdapter.for_model`); Gemma 3's packed masks need it.
    video_token_id / tokens_per_second: the video token, and Qwen2.5-VL's M-RoPE time scale (config.json).
    """

    family: str
    image_token_id: int
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD
    patch_size: int = 14
    merge_size: int = 1
    temporal_patch_size: int = 1
    vision_start_token_id: int | None = None
    vocab_size: int | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    image_size: int | None = None
    policy: dict | None = None              # a tiled family's image policy (decode.tiled), as in its manifest
    sliding_window: int | None = None       # the text model's sliding-window span (Gemma 3's packed masks)
    video_token_id: int | None = None       # Qwen2-VL / Qwen2.5-VL: `<|video_pad|>`; LLaVA-OneVision: `<video>`
    tokens_per_second: float | None = None  # Qwen2.5-VL: temporal positions per second of video

    def __post_init__(self) -> None:
        if self.family not in FAMILIES.values():
            raise ConfigError(f"unknown model family {self.family!r}: use one of {', '.join(FAMILIES.values())}")
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or min(self.image_std) <= 0:
            raise ConfigError(f"image_mean/image_std must be 3 values (std > 0), got {self.image_mean}/{self.image_std}")
        if self.is_qwen and (self.min_pixels is None or self.max_pixels is None):
            raise ConfigError(f"{self.family} needs min_pixels and max_pixels")
        if self.policy is not None:
            if not is_tiled(make_policy(self.policy)):
                raise ConfigError(f"{self.family}: policy must be a tiled image policy, got {self.policy}")
        elif not self.is_qwen:
            if self.image_size is None:
                raise ConfigError("llava needs image_size (the vision tower's input side)")
            if self.merge_size != 1 or self.temporal_patch_size != 1:
                raise ConfigError("llava has no merge or temporal axis: merge_size and temporal_patch_size must be 1")

    @property
    def is_qwen(self) -> bool:
        """Qwen2-VL, Qwen2.5-VL or Qwen3-VL: flattened patches, image_grid_thw, 3-D M-RoPE positions."""
        return self.family in QWEN_FAMILIES

    def image_policy(self) -> ImagePolicy:
        """The vlmdata image policy that gives each image the tokens this model expects."""
        if self.policy is not None:
            return make_policy(self.policy)
        if self.is_qwen:
            return DynamicPolicy(patch=self.patch_size, merge=self.merge_size, min_pixels=int(self.min_pixels),
                                 max_pixels=int(self.max_pixels))
        return FixedPolicy(size=int(self.image_size), patch=self.patch_size, merge=1)

    def check_policy(self, policy: ImagePolicy) -> None:
        """Raise unless `policy` lays images out as this model's processor does."""
        want = self.image_policy()
        if policy != want:
            raise ConfigError(f"the dataset's image policy {policy} does not match {self.family}'s processor "
                              f"({want}); create the VLMDataset with image_size=spec.image_policy()")

    def check_tokenizer(self, tokenizer: dict) -> None:
        """Raise unless a dataset tokenized as `tokenizer` (its manifest entry) feeds this model.

        The image token must be the model's, and every id must have an embedding row.
        """
        special = tokenizer.get("special", {}) if isinstance(tokenizer, dict) else {}
        image = special.get("image")
        name = tokenizer.get("name", "?") if isinstance(tokenizer, dict) else "?"
        if image is not None and int(image) != self.image_token_id:
            raise ConfigError(f"the dataset marks images with token id {image} (tokenizer {name}) but {self.family} "
                              f"expects image_token_id={self.image_token_id}: shard the dataset with the model's "
                              "tokenizer, or use a model config whose image_token_id matches the dataset")
        vocab = tokenizer.get("vocab_size") if isinstance(tokenizer, dict) else None
        if vocab is not None and self.vocab_size is not None and int(vocab) > self.vocab_size:
            raise ConfigError(f"the dataset's tokenizer {name} has {vocab} ids but the model's vocabulary has "
                              f"{self.vocab_size} rows: ids past {self.vocab_size - 1} would index past the "
                              "embedding table")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        fields = dict(data)
        for k in ("image_mean", "image_std"):
            if k in fields:
                fields[k] = tuple(float(x) for x in fields[k])
        return cls(**fields)

    @classmethod
    def from_family(cls, family) -> ModelSpec:
        """The spec of a model family as vlmdata's text layer read it from the model folder at shard or
        retokenize time (`vlmdata.text.families.FamilySpec`, also `VLMDataset.model_family`)."""
        name = FAMILIES.get(family.name)
        if name is None:
            raise ConfigError(f"model family {family.name!r} has no vlmdata output adapter "
                              f"(supported: {', '.join(sorted(FAMILIES))})")
        v = family.vision
        common = {"family": name, "image_token_id": v.image_token_id, "image_mean": tuple(v.image_mean),
                  "image_std": tuple(v.image_std), "patch_size": v.patch_size}
        if name in QWEN_FAMILIES:
            return cls(**common, merge_size=v.merge_size, temporal_patch_size=v.temporal_patch_size,
                       vision_start_token_id=v.vision_start_id, min_pixels=v.min_pixels, max_pixels=v.max_pixels,
                       video_token_id=v.video_token_id, tokens_per_second=v.tokens_per_second)
        if v.policy.get("kind") not in ("fixed", "dynamic"):
            return cls(**common, merge_size=v.merge_size, vocab_size=family.vocab_size, policy=dict(v.policy),
                       video_token_id=v.video_token_id)
        return cls(**common, image_size=v.image_size)

    @classmethod
    def from_dataset(cls, dataset) -> ModelSpec:
        """The spec of the model family a VLMDataset's text view was made for (`--tokenizer MODEL_DIR`)."""
        family = getattr(dataset, "model_family", None)
        if family is None:
            raise ConfigError("this dataset was tokenized with vlmdata's own tokenizer, not a model's: shard it "
                              "with --tokenizer MODEL_DIR (or add a view with `vlmdata retokenize`), or build the "
                              "spec from the model folder with ModelSpec.from_folder(DIR)")
        return cls.from_family(family)

    @classmethod
    def from_folder(cls, path: str) -> ModelSpec:
        """Read a model or processor folder (config.json, and preprocessor_config.json when present)."""
        config = _read_json(os.path.join(path, "config.json"), required=True)
        pre = _read_json(os.path.join(path, "preprocessor_config.json"), required=False)
        model_type = config.get("model_type")
        family = FAMILIES.get(model_type)
        if family is None:
            return cls._generic_from_folder(path, config, model_type)
        if family not in QWEN_FAMILIES and family != "llava":
            return cls._tiled_from_folder(path, config)
        if pre is None:
            log.warning("%s has no preprocessor_config.json: using %s's processor defaults", path, family)
            pre = {}
        build = _qwen_fields if family in QWEN_FAMILIES else _llava_fields
        return cls(family=family, **build(path, config, pre, _FAMILY_DEFAULTS.get(family, {})))


    @classmethod
    def _tiled_from_folder(cls, path: str, config: dict) -> ModelSpec:
        """A tiled family's spec: its image policy names tokens, so it comes from the processor folder's
        tokenizer through the text family (`vlmdata.text.families`)."""
        from vlmdata.text.families import load_family

        spec = cls.from_family(load_family(path).spec)
        vocab, window = _text_vocab(config), (config.get("text_config") or {}).get("sliding_window")
        return replace(spec, vocab_size=vocab if vocab is not None else spec.vocab_size,
                       sliding_window=int(window) if window is not None else None)


    @classmethod
    def _generic_from_folder(cls, path: str, config: dict, model_type) -> ModelSpec:
        """The generic family's spec (its processor's rules), or why a folder has no adapter."""
        from vlmdata.text.families import load_family

        try:
            family = load_family(path)
        except ConfigError as exc:
            raise ConfigError(f"{path}: model_type {model_type!r} has no vlmdata output adapter (supported: "
                              f"{', '.join(sorted(FAMILIES))}), and the generic family cannot serve it: {exc}") from exc
        return cls._tiled_from_folder(path, config) if family.name == "generic" else cls.from_family(family.spec)


def _read_json(path: str, required: bool) -> dict | None:
    raw = read_model_file(os.path.dirname(path), os.path.basename(path))   # size-checked, inside the folder
    if raw is None:
        if required:
            raise ConfigError(f"{path} does not exist: pass a Hugging Face model or processor folder")
        return None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data


def _agree(path: str, name: str, *values) -> int:
    """The one value several files give for `name` (None = not given); they must agree."""
    given = {int(v) for v in values if v is not None}
    if len(given) > 1:
        raise ConfigError(f"{path}: config.json and preprocessor_config.json disagree on {name}: {sorted(given)}")
    return given.pop() if given else None


def _text_vocab(config: dict) -> int | None:
    text = config.get("text_config") or {}
    vocab = text.get("vocab_size", config.get("vocab_size"))
    return int(vocab) if vocab is not None else None


def _norm(pre: dict) -> dict:
    out = {}
    for key in ("image_mean", "image_std"):
        if key in pre:
            value = pre[key]
            out[key] = tuple(float(x) for x in (value if isinstance(value, (list, tuple)) else [value] * 3))
    return out


def _token_id(path: str, config: dict, *names: str) -> int:
    for name in names:
        if config.get(name) is not None:
            return int(config[name])
    raise ConfigError(f"{path}/config.json has no {' or '.join(names)}")


def _qwen_fields(path: str, config: dict, pre: dict, defaults: dict) -> dict:
    vision = config.get("vision_config") or {}
    size = pre.get("size") or {}
    fields = {
        "image_token_id": _token_id(path, config, "image_token_id"),
        "vision_start_token_id": config.get("vision_start_token_id"),
        "vocab_size": _text_vocab(config),
        "patch_size": _agree(path, "patch_size", vision.get("patch_size"), pre.get("patch_size")),
        "merge_size": _agree(path, "merge_size", vision.get("spatial_merge_size"), pre.get("merge_size")),
        "temporal_patch_size": _agree(path, "temporal_patch_size", vision.get("temporal_patch_size"),
                                      pre.get("temporal_patch_size")),
        "min_pixels": _agree(path, "min_pixels", pre.get("min_pixels"), size.get("shortest_edge")),
        "max_pixels": _agree(path, "max_pixels", pre.get("max_pixels"), size.get("longest_edge")),
        "video_token_id": config.get("video_token_id"),
        "tokens_per_second": float(vision.get("tokens_per_second", 4)) if config.get("model_type") == "qwen2_5_vl"
        else None,                                          # 4: Qwen2_5_VLVisionConfig's default
    }
    defaults = {**_QWEN_DEFAULTS, **defaults}
    for key in _QWEN_DEFAULTS:
        if fields[key] is None:
            fields[key] = defaults[key]
    fields.update({k: v for k, v in defaults.items() if k not in fields}, **_norm(pre))
    return fields


def _llava_fields(path: str, config: dict, pre: dict, defaults: dict) -> dict:
    vision = config.get("vision_config") or {}
    strategy = config.get("vision_feature_select_strategy", "default")
    if strategy != "default":
        raise ConfigError(f"{path}: vision_feature_select_strategy={strategy!r} keeps the CLS token (one more "
                          "image feature than patches); vlmdata's LLaVA layout is 'default' (patches only)")
    crop = pre.get("crop_size") or {}
    crop_side = crop.get("height") if isinstance(crop, dict) else crop
    image_size = _agree(path, "image_size", vision.get("image_size"), crop_side)
    return {
        "image_token_id": _token_id(path, config, "image_token_id", "image_token_index"),
        "vocab_size": _text_vocab(config),
        "patch_size": _agree(path, "patch_size", vision.get("patch_size")) or 14,
        "image_size": image_size or 336,
        **_norm(pre),
    }
