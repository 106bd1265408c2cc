"""Building a Hugging Face VLM from a model folder in the configuration packed batches need.

`load_model(DIR)` returns the family's `...ForConditionalGeneration`:
pretrained weights when the folder has them (`*.safetensors` / `*.bin`),
otherwise randomly initialised from `config.json` (seeded by the caller's
`torch.manual_seed`). The attention implementation is the packed one for the
device (`choose_attention`):

- on CUDA with flash-attn importable: `flash_attention_2`, which reads the
  pack's `cu_seq_lens_q/k` (varlen kernel: no cross-sample attention and no
  T x T mask). LLaVA's CLIP tower is given `sdpa`: it would otherwise receive
  the text's `cu_seq_lens_*` (LLaVA forwards its keyword arguments to the
  vision tower) and attend over the wrong segments. Qwen's vision tower drops
  them itself.
- otherwise `vlmdata_varlen` (`vlmdata.hf.varlen`, registered here), which
  also reads `cu_seq_lens_*`: torch's varlen kernel on CUDA, one SDPA per
  sample elsewhere, cost sum(L_i^2).

`sdpa` and `eager` work too when asked for (the adapter then adds the 4-D
block-diagonal mask: T^2 per head and layer).

The KV cache is turned off (`use_cache=False`): training needs none, and with a
cache transformers would not look for packed sequences in the position ids.
"""
from __future__ import annotations

import glob
import importlib.util
import logging
import os

import torch

from vlmdata.errors import ConfigError
from vlmdata.hf.spec import ModelSpec
from vlmdata.hf.varlen import VARLEN_ATTENTION, register_varlen_attention

__all__ = ["choose_attention", "has_weights", "load_model"]

log = logging.getLogger(__name__)


def choose_attention(device: torch.device | str | None = None, requested: str = "auto") -> str:
    """The attention implementation for packed batches on `device` ("auto"), or `requested` checked."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if requested != "auto":
        if "flash" in requested and device.type != "cuda":
            raise ConfigError(f"{requested} runs on CUDA only; on {device.type} use sdpa (the adapter adds a "
                              "block-diagonal mask)")
        return requested
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return VARLEN_ATTENTION


def has_weights(path: str) -> bool:
    """True when the folder holds model weights (else the model is randomly initialised from config.json)."""
    return any(glob.glob(os.path.join(path, pattern)) for pattern in ("*.safetensors", "pytorch_model*.bin"))


def _model_class(family: str):
    import transformers

    names = {"qwen2-vl": "Qwen2VLForConditionalGeneration", "qwen2.5-vl": "Qwen2_5_VLForConditionalGeneration",
             "qwen3-vl": "Qwen3VLForConditionalGeneration", "llava": "LlavaForConditionalGeneration",
             "gemma3": "Gemma3ForConditionalGeneration", "internvl": "InternVLForConditionalGeneration",
             "llava-onevision": "LlavaOnevisionForConditionalGeneration",
             "generic": "AutoModelForImageTextToText",
             "idefics3": "Idefics3ForConditionalGeneration", "smolvlm": "SmolVLMForConditionalGeneration"}
    return getattr(transformers, names[family])


def load_model(path: str, attn_implementation: str = "auto", dtype: torch.dtype = torch.float32,
               device: torch.device | str | None = None):
    """The model of folder `path` (see the module docstring), on `device`, in `dtype`."""
    from transformers import AutoConfig

    spec = ModelSpec.from_folder(path)
    attn = choose_attention(device, attn_implementation)
    if spec.family == "gemma3" and attn_implementation == "auto":
        attn = "sdpa"                     # Gemma 3's image attention is bidirectional: no varlen/flash path
    if attn == VARLEN_ATTENTION:
        register_varlen_attention()
    cls = _model_class(spec.family)
    impl: str | dict = attn
    if spec.family in ("llava", "llava-onevision") and "flash" in attn:
        impl = {"text_config": attn, "vision_config": "sdpa", "": attn}
    if has_weights(path):
        log.info("loading %s weights from %s (attention: %s)", spec.family, path, attn)
        model = cls.from_pretrained(path, attn_implementation=impl, dtype=dtype)
    else:
        log.info("building %s from %s/config.json, randomly initialised (attention: %s)", spec.family, path, attn)
        config = AutoConfig.from_pretrained(path)
        build = cls.from_config if cls.__name__.startswith("Auto") else cls._from_config   # generic: the auto class
        model = build(config, attn_implementation=impl, dtype=dtype)
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        config.use_cache = False
    if device is not None:
        model = model.to(device)
    return model
