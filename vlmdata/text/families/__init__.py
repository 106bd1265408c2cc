"""Model families: each VLM's own tokenizer, chat template, loss mask and image-token layout."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "FamilySpec": "base", "ModelFamily": "base", "TRAIN_ON": "base", "VisionSpec": "base",
    "FAMILIES": "registry", "load_family": "registry", "family_names": "registry",
    "Idefics3Family": "idefics3", "SmolVLMFamily": "idefics3",
    "Gemma3Family": "gemma3", "PAN_AND_SCAN_DEFAULTS": "gemma3", "replace_marked": "base", "InternVLFamily": "internvl",
    "LlavaOnevisionFamily": "llava_onevision",
    "LlavaFamily": "llava", "GenericFamily": "generic", "Qwen2VLFamily": "qwen2_vl", "Qwen25VLFamily": "qwen2_vl",
})
