"""Image decoding: image policies, patch flattening, the TurboJPEG and Pillow decoders, and the choice between decoders (DALI lives in `decode.dali`)."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "PIXEL_MODES": "exact", "ExactDecoder": "exact", "check_pixels": "exact",
    "check_codecs": "codec_support", "missing_codecs": "codec_support",
    "failure_reason": "failures",
    "fastest_cpu_decoder": "choose", "make_decoder": "choose", "make_gpu_stage": "choose",
    "save_cpu_choice": "choose", "dali_available": "choose",
    "ImageDecoder": "interface",
    "flatten_patches": "patches", "pack_patches": "patches", "unflatten_patches": "patches",
    "PillowDecoder": "pillow",
    "clean_structure": "structure",
    "EXCLUDED_FORMATS": "probe", "loader_formats": "probe", "open_image": "probe", "probe_decode": "probe", "scrub": "probe",
    "DynamicPolicy": "policy", "FixedPolicy": "policy", "ImagePolicy": "policy", "make_policy": "policy",
    "TiledPolicy": "tiled", "is_tiled": "tiled", "register_kind": "tiled", "sample_args": "tiled",
    "TurboDecoder": "turbo", "scale_for": "turbo",
})
