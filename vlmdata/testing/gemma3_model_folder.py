"""A small Gemma 3 processor (and tiny model) folder for tests and benchmarks, built at test time.

No Gemma file is on PyPI in a usable size, so the tokenizer is built with the `tokenizers` library the way
Gemma's is laid out (transformers' `GemmaTokenizer`): a BPE with byte fallback over text whose spaces
are replaced by "▁" (no pre-tokenizer split, so "\\n\\n" merges with the words and spaces beside it, as
in Gemma's vocabulary), `<bos>` added in front, Gemma's special tokens in Gemma's order
(`<pad>` `<eos>` `<bos>` `<unk>` `<mask>` ... `<start_of_turn>` `<end_of_turn>` `<start_of_image>`
`<end_of_image>`, and `<image_soft_token>` last, as in the real vocabulary). It is trained on text
rich in newlines and spaces next to words, so the pieces the processor puts around each image
("\\n\\n" before `<start_of_image>` and after `<end_of_image>`) merge with the user's text.

The chat template is Gemma 3's own (google/gemma-3-4b-it `tokenizer_config.json`: the system prompt
folded into the first user turn, `model` for the assistant role, `| trim` on every text).
`preprocessor_config.json` is written by transformers' `Gemma3ImageProcessorPil` with Gemma 3's
published settings (896 px, bilinear, mean/std 0.5, pan-and-scan off) and `config.json` by
`Gemma3Config`; `tiny=True` makes the model in it a tiny randomly initialisable one (a 1-layer SigLIP,
a 2-layer Gemma 3 text model with sliding and full attention layers).
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["GEMMA3_CHAT_TEMPLATE", "GEMMA3_SPECIALS", "gemma3_folder"]

GEMMA3_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>",
                   "<start_of_image>", "<end_of_image>")
IMAGE_SOFT_TOKEN = "<image_soft_token>"

GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n")

# Training text: words, punctuation, spaces and newlines side by side (so merges cross "\n\n" boundaries).
_CORPUS = [
    "What is in this picture?\n\nA red box on a wooden table.\n\n",
    "Compare:\n\n the first with the second. \n\nThe first is wide, the second is tall.\n",
    "You are a careful annotator.\n\nAnswer in one sentence. Describe the scene in detail please.\n\n\n",
    "Look at this image:\n\n and this one\n\n. Four images: count them. Sure? Yes, four.\nLine two.",
    "the quick brown fox jumps over the lazy dog  \n\n  model\nuser\n naïve café, Привет, 東京 ☕\n\n",
]


def _tokenizer(vocab_size: int):
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    def shaped(model):
        tok = Tokenizer(model)
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
        return tok

    trained = shaped(models.BPE(unk_token="<unk>"))
    trained.train_from_iterator(_CORPUS * 20, trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False))
    learned = json.loads(trained.to_str())["model"]
    vocab = {t: i for i, t in enumerate(GEMMA3_SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t in sorted(learned["vocab"], key=learned["vocab"].get):
        vocab.setdefault(t, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    tok = shaped(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in (*GEMMA3_SPECIALS,
                                                                                    IMAGE_SOFT_TOKEN)])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", vocab["<bos>"])])
    return tok


def _tiny_config(vocab: int, ids: dict, image_size: int, tokens: int, sliding_window: int):
    from transformers import Gemma3Config

    text = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=8192, sliding_window=sliding_window,
                layer_types=["sliding_attention", "full_attention"], pad_token_id=ids["<pad>"],
                bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"])
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=image_size, patch_size=14)
    return Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=tokens,
                        boi_token_index=ids["<start_of_image>"], eoi_token_index=ids["<end_of_image>"],
                        image_token_index=ids[IMAGE_SOFT_TOKEN])


def gemma3_folder(path: Path, *, image_size: int = 896, tokens_per_image: int = 256, tiny: bool = False,
                  sliding_window: int = 512, vocab_size: int = 700, **image_settings) -> Path:
    """Write a Gemma 3 processor folder at `path` (see the module docstring); `image_settings` go to
    Gemma3ImageProcessorPil (e.g. do_pan_and_scan=True, resample=3)."""
    from transformers import Gemma3Config, Gemma3ImageProcessorPil

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(vocab_size)
    tok.save(str(path / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in (*GEMMA3_SPECIALS, IMAGE_SOFT_TOKEN)}
    extra = {"image_token": IMAGE_SOFT_TOKEN, "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"}
    _write(path / "tokenizer_config.json", {
        "tokenizer_class": "GemmaTokenizer", "processor_class": "Gemma3Processor", "bos_token": "<bos>",
        "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>",
        "add_bos_token": True, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "spaces_between_special_tokens": False, "model_max_length": 131072, "extra_special_tokens": extra})
    _write(path / "chat_template.json", {"chat_template": GEMMA3_CHAT_TEMPLATE})
    settings = {"size": {"height": image_size, "width": image_size}, "resample": 2, "image_mean": [0.5] * 3,
                "image_std": [0.5] * 3, **image_settings}
    pre = Gemma3ImageProcessorPil(**settings).to_dict()
    _write(path / "preprocessor_config.json", {**pre, "image_processor_type": "Gemma3ImageProcessor",
                                               "processor_class": "Gemma3Processor"})
    _write(path / "processor_config.json", {"processor_class": "Gemma3Processor", "image_seq_length": tokens_per_image})
    vocab = 8 * -(-tok.get_vocab_size() // 8)
    if tiny:
        config = _tiny_config(vocab, ids, image_size, tokens_per_image, sliding_window)
    else:
        config = Gemma3Config(text_config={"vocab_size": vocab}, mm_tokens_per_image=tokens_per_image,
                              vision_config={"model_type": "siglip_vision_model", "image_size": image_size,
                                             "patch_size": 14},
                              boi_token_index=ids["<start_of_image>"], eoi_token_index=ids["<end_of_image>"],
                              image_token_index=ids[IMAGE_SOFT_TOKEN])
    config.architectures = ["Gemma3ForConditionalGeneration"]
    _write(path / "config.json", config.to_dict())
    return path


def _write(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False), encoding="utf-8")
