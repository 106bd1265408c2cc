"""The generic family: any model whose processor transformers loads, for models without a native family.

Tried after every native family (`registry.FAMILIES`), for folders whose config.json `model_type` (or
processor class) transformers has a processor for. Shard time is as for every family: the folder's
chat template renders the conversation, the image marker the template writes (the processor's
`image_token`) stays one placeholder token. Load time asks the model's own processor
(`decode.tiling.processor`, policy kind "processor"): its expansion of the image token, its
counting method, its image processor's pixel_values (and whatever else it returns per image) in the
DataLoader workers. Trained spans are the template's (`{% generation %}` blocks when it has them).

When the family loads it checks, on probe images and texts, that the processor can be followed this
way (`generic_checks`); what it cannot follow (no processor, torchvision-only processors, expansions
depending on pixels, text added around the marker that changes its neighbours' tokens, extra text keys
such as token_type_ids) is a ConfigError naming it.
"""
from __future__ import annotations

from dataclasses import replace

from vlmdata.decode.tiling.hf_folder import folder_files, load_processor
from vlmdata.decode.tiling.processor import ProcessorPolicy
from vlmdata.errors import ConfigError
from vlmdata.text.families.base import ModelFamily, VisionSpec
from vlmdata.text.families.generic_checks import (
    check_batching,
    check_tokenization,
    choose_count_rule,
    probe_expansions,
)
from vlmdata.text.model_folder import ModelFolder

__all__ = ["GenericFamily", "transformers_knows"]


def transformers_knows(folder: ModelFolder) -> bool:
    """True when transformers knows the folder's model_type or processor class (loading its processor may
    still fail: the family then says why)."""
    h = folder.hints()
    if h["model_type"] is None and h["processor_class"] is None:
        return False
    try:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:
        return False
    if h["model_type"] is not None:
        return h["model_type"] in CONFIG_MAPPING_NAMES
    return hasattr(transformers, str(h["processor_class"]))


def _three(value, default: float) -> tuple[float, float, float]:
    if value is None:
        return (default,) * 3
    values = tuple(float(x) for x in (value if isinstance(value, (list, tuple)) else [value] * 3))
    return values if len(values) == 3 else (default,) * 3


class GenericFamily(ModelFamily):
    """Any processor transformers knows, followed through the processor itself (see the module docstring)."""

    name = "generic"

    def __init__(self, folder: ModelFolder, train_on: str = "assistant"):
        self.files = folder_files(folder.path)
        self.processor = load_processor(folder.path, self.files)
        super().__init__(folder, train_on)
        check_tokenization(self)

    @classmethod
    def matches(cls, folder: ModelFolder) -> bool:
        return transformers_knows(folder)

    def vision_spec(self) -> VisionSpec:
        proc = self.processor
        ip = proc.image_processor
        marker = proc.image_token
        marker_id = self.token_id(marker)
        if self.tokenizer.encode(marker, add_special_tokens=False).ids != [marker_id]:
            raise ConfigError(f"{self.folder.path}: the image marker {marker!r} is not one token of the tokenizer")
        patch = next((p for p in (getattr(proc, "patch_size", None), getattr(ip, "patch_size", None))
                      if isinstance(p, int)), 0)
        policy = ProcessorPolicy(folder=self.folder.path, files=self.files, image_token_id=marker_id, tile=0,
                                 patch=patch)
        expansions = probe_expansions(policy)
        rule, offset = choose_count_rule(policy, expansions)
        check_batching(policy, expansions)
        policy = replace(policy, count_rule=rule, count_offset=offset)
        return VisionSpec(
            image_token=marker, image_token_id=marker_id, vision_start_id=None, vision_end_id=None,
            patch_size=policy.patch, merge_size=1, temporal_patch_size=1,
            image_mean=_three(getattr(ip, "image_mean", None), 0.5),
            image_std=_three(getattr(ip, "image_std", None), 0.5),
            min_pixels=None, max_pixels=None, image_size=None, resample=int(getattr(ip, "resample", 3) or 3),
            policy=policy.to_dict())
