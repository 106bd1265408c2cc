"""Which text view a loader reads, and what follows from it: the model family, the image policy, mixing rules.

- Datasets mixed in one VLMDataset must share the view's tokenizer identity: the SHA-256 of the
  model folder's tokenizer files (and its vision constants), or for vlmdata's own tokenizers the
  same special ids. Anything else is a clear error.
- The image budget per pack: a dynamic-resolution policy (Qwen2-VL, Qwen2.5-VL: each image a patch
  sequence of its own length, run by the vision tower as one varlen sequence per pack) needs no image
  count limit, only a patch budget: `max_patches`, by default what the token budget already implies
  (max_tokens x merge^2, each image token being merge^2 patches); lower it to bound the vision tower's
  memory. A fixed-size or tiled policy (LLaVA, InternVL: the tower batches whole images or tiles)
  keeps `max_images` = 16.
- The image policy: None takes the model family's (what its processor does); an explicit policy is
  accepted when it lays out the same image tokens (same kind, patch and merge; a dynamic policy may
  narrow the pixel bounds; a tiled one must be the family's own), else it is an error (the model would
  see the wrong number of tokens). A tiled policy decodes with Pillow in the workers.
- The pixel mode: None is "exact" (the family's image processor's pixels, bit for bit) for a dataset
  with a model family decoded in the workers by Pillow, else "fast"; an explicit "exact" that cannot be
  honoured (no family, memmap images stored resized, a fast-only decoder, decode deferred to the
  GPU) is an error saying why.
"""
from __future__ import annotations

import json

from vlmdata.decode.exact import check_pixels
from vlmdata.decode.policy import DynamicPolicy, FixedPolicy, ImagePolicy, make_policy
from vlmdata.decode.tiled import is_tiled
from vlmdata.errors import ConfigError
from vlmdata.text.families.base import FamilySpec

__all__ = ["DEFAULT_IMAGE_SIZE", "DEFAULT_MAX_IMAGES", "check_text_views", "check_tiled_decode",
           "choose_pack_limits", "choose_pixels", "choose_policy"]

DEFAULT_IMAGE_SIZE = 336
DEFAULT_MAX_IMAGES = 16


def _describe(source) -> str:
    tok = source.tokenizer
    name = tok.get("model") or tok.get("path") or tok.get("name")
    return f"{source.root} (view {source.view_name!r}, tokenizer {name})"


def check_text_views(sources: list) -> FamilySpec | None:
    """The model family the sources' views share (None for vlmdata's own tokenizers); ConfigError when
    they were tokenized differently."""
    families = [FamilySpec.from_identity(s.tokenizer) for s in sources]
    first = families[0]
    for s, fam in zip(sources[1:], families[1:]):
        if (first is None) != (fam is None):
            raise ConfigError(f"cannot mix {_describe(sources[0])} with {_describe(s)}: one uses a model's tokenizer, "
                              "the other vlmdata's own; add a view with the same model (`vlmdata retokenize`)")
        if first is None:
            a = json.dumps(sources[0].tokenizer.get("special", {}), sort_keys=True)
            b = json.dumps(s.tokenizer.get("special", {}), sort_keys=True)
            if a != b:
                raise ConfigError(f"cannot mix {_describe(sources[0])} with {_describe(s)}: they were tokenized with "
                                  "different tokenizers (special ids differ); re-shard them with one tokenizer")
        elif fam.tokenizer_sha256 != first.tokenizer_sha256 or fam.vision != first.vision:
            raise ConfigError(f"cannot mix {_describe(sources[0])} with {_describe(s)}: their tokenizer files or "
                              "vision settings differ (tokenizer identity sha256 "
                              f"{first.tokenizer_sha256[:12]} vs {fam.tokenizer_sha256[:12]}); add a view with one "
                              "model to each (`vlmdata retokenize DATASET --tokenizer MODEL_DIR`) and pick it with "
                              "text_view=")
    return first


def choose_policy(image_size, family: FamilySpec | None) -> ImagePolicy:
    """The image policy to load with (see the module docstring)."""
    if family is None:
        return make_policy(DEFAULT_IMAGE_SIZE if image_size is None else image_size)
    native = family.vision.image_policy()
    if image_size is None:
        return native
    asked = make_policy(image_size)
    same_kind = type(asked) is type(native)
    if same_kind and isinstance(native, FixedPolicy) and asked == native:
        return asked
    if same_kind and isinstance(native, DynamicPolicy) and (asked.patch, asked.merge) == (native.patch, native.merge):
        return asked
    if same_kind and is_tiled(native) and asked == native:
        return asked
    raise ConfigError(f"the dataset's {family.name} view lays out images with {native.to_dict()}; image_size="
                      f"{asked.to_dict()} would give the model other image tokens (leave image_size=None, or keep "
                      "the kind, patch and merge and change only the pixel bounds)")


def check_tiled_decode(policy: ImagePolicy, decoder: str, defer_decode: bool) -> None:
    """ConfigError when a tiled policy's images would go to a decoder that cannot tile them."""
    if not is_tiled(policy):
        return
    if defer_decode:
        raise ConfigError(f"the {policy.kind} image policy cuts images into tiles in the DataLoader workers: "
                          "defer_decode (the GPU decode stage) does not tile; leave defer_decode off")
    if decoder not in ("auto", "pillow"):
        raise ConfigError(f"decoder={decoder!r} does not tile images; the {policy.kind} image policy decodes "
                          "with Pillow: use decoder='auto' or 'pillow'")


def choose_pack_limits(policy: ImagePolicy, max_tokens: int, max_images: int | None,
                       max_patches: int | None) -> tuple[int | None, int | None]:
    """(max_images, max_patches) per pack: what was asked for, else the policy's default (see the module
    docstring); ConfigError when both are given."""
    if max_images is not None and max_patches is not None:
        raise ConfigError(f"give the image budget per pack as max_images ({max_images}) or as max_patches "
                          f"({max_patches}), not both")
    if max_images is not None or max_patches is not None:
        return max_images, max_patches
    if isinstance(policy, DynamicPolicy):
        return None, int(max_tokens) * policy.merge * policy.merge
    return DEFAULT_MAX_IMAGES, None


def _inexact_reason(family: FamilySpec | None, decoder: str, memmap: bool, defer_decode: bool) -> str | None:
    if family is None:
        return "the dataset has no model family (shard it with --tokenizer MODEL_DIR): there is no processor"
    if memmap:
        return "memmap datasets store images already resized at shard time"
    if defer_decode:
        return "defer_decode leaves decoding to the training process (the DALI GPU stage is fast mode)"
    if decoder not in ("auto", "pillow"):
        return f"decoder={decoder!r} decodes fast pixels only (use 'auto' or 'pillow')"
    return None


def choose_pixels(asked: str | None, family: FamilySpec | None, decoder: str, memmap: bool,
                  defer_decode: bool) -> str:
    """The pixel mode to decode with (see the module docstring)."""
    reason = _inexact_reason(family, decoder, memmap, defer_decode)
    if asked is None:
        return "fast" if reason else "exact"
    if check_pixels(asked) == "exact" and reason:
        raise ConfigError(f"pixels='exact' is not possible: {reason}; pass pixels='fast'")
    return asked
