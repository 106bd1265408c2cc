"""Tiny Hugging Face VLMs and reference packs for the vlmdata.hf tests.

- `write_qwen_folder` / `write_llava_folder`: a model folder (config.json +
  preprocessor_config.json) for a tiny `Qwen2VLForConditionalGeneration` or a
  LLaVA (tiny CLIP vision tower + tiny Llama), randomly initialised, fp32 on CPU.
- `qwen_processor` / `llava_processor`: the real transformers processors, built
  on a small word-level tokenizer (made with the `tokenizers` library) that has
  the family's special tokens; they are the reference for token ids and pixels.
- `reference_pack`: a PackedBatch whose token ids come from the processor and
  whose pixels come from vlmdata's own decode and collate path (the Pillow
  decoder at the model's image policy, `collate_pack`), i.e. the layout the
  adapters meet in training; plus the processor's own output per sample
  (`references(..., exact=True)`: the processor-exact decoder, the processor
  given the original files).
- `qwen3_processor` / `write_qwen3_folder`: the same for Qwen3-VL (patch 16,
  mean/std 0.5; `Qwen3VLProcessor`, `Qwen3VLConfig`); `qwen2_5_processor` /
  `write_qwen2_5_folder` for Qwen2.5-VL (windowed vision attention).
- `internvl_processor` / `write_internvl_folder`: InternVL3 (`InternVLProcessor`,
  `GotOcr2ImageProcessorPil` with 56 px tiles, 1 to 4 of them plus the thumbnail, 4 tokens per tile;
  a tiny `InternVLForConditionalGeneration`); the folder is a whole processor folder (tokenizer, chat
  template), as vlmdata reads a tiled family's image policy through its text family.
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

WORDS = ("a the red blue green dog cat car tree sky what is in picture describe it shows two one small big "
         "left right and of image photo").split()
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>"]
LLAVA_SPECIALS = ["<s>", "</s>", "<image>", "<pad>"]
QWEN_PIXELS = (56 * 56, 224 * 224)      # min_pixels, max_pixels of the tiny Qwen2-VL
QWEN3_PIXELS = (64 * 64, 256 * 256)     # and of the tiny Qwen3-VL (patch 16, merge 2)
LLAVA_SIZE = 336
ONEVISION_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]
ONEVISION_TILE = 28                     # the tiny LLaVA-OneVision's tiles: 2 x 2 features (patch 14)
ONEVISION_PINPOINTS = [[ONEVISION_TILE * a, ONEVISION_TILE * b] for a in range(1, 5) for b in range(1, 5)]
INTERNVL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>"]
INTERNVL_TILE, INTERNVL_MAX_TILES, INTERNVL_PER_TILE = 56, 4, 4     # (56 / 14)^2 patches / 4 (pixel shuffle)


def word_tokenizer(specials: list[str], bos: str | None = None, eos: str | None = None, pad: str | None = None,
                   **named):
    """A transformers fast tokenizer over WORDS (whitespace split) with the given special tokens (`named`: more
    tokens the processor takes by name, e.g. InternVL's `context_image_token`)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "USER:", "ASSISTANT:", "user", "assistant", "system"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials)
    extra = {"extra_special_tokens": named} if named else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token=bos, eos_token=eos,
                                   pad_token=pad, **extra)


def _unchecked(cls):
    """The processor class without its attribute class check (it looks up the video-processor registry,
    which needs torchvision, for a video processor these tests do not use)."""
    return type(cls.__name__, (cls,), {"check_argument_for_proper_class": lambda self, name, arg: type(arg)})


def qwen_processor():
    from transformers.models.qwen2_vl import Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = word_tokenizer(QWEN_SPECIALS, eos="<|im_end|>", pad="<|endoftext|>")
    images = Qwen2VLImageProcessorPil(min_pixels=QWEN_PIXELS[0], max_pixels=QWEN_PIXELS[1])
    return _unchecked(Qwen2VLProcessor)(image_processor=images, tokenizer=tok)


def qwen3_image_processor(pixels: tuple[int, int] = QWEN3_PIXELS):
    """Qwen3-VL's image processor: transformers' Qwen2-VL one with patch 16 and mean/std 0.5."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                    size={"shortest_edge": pixels[0], "longest_edge": pixels[1]})


def qwen3_processor():
    from transformers.models.qwen3_vl import Qwen3VLProcessor

    tok = word_tokenizer(QWEN_SPECIALS, eos="<|im_end|>", pad="<|endoftext|>")
    return _unchecked(Qwen3VLProcessor)(image_processor=qwen3_image_processor(), tokenizer=tok)


def qwen2_5_processor():
    """Qwen2.5-VL's processor (Qwen2-VL's image processor settings and token layout)."""
    from transformers.models.qwen2_5_vl import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = word_tokenizer(QWEN_SPECIALS, eos="<|im_end|>", pad="<|endoftext|>")
    images = Qwen2VLImageProcessorPil(min_pixels=QWEN_PIXELS[0], max_pixels=QWEN_PIXELS[1])
    return _unchecked(Qwen2_5_VLProcessor)(image_processor=images, tokenizer=tok)


def llava_processor():
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.llava import LlavaProcessor

    tok = word_tokenizer(LLAVA_SPECIALS, bos="<s>", eos="</s>", pad="<pad>")
    images = CLIPImageProcessorPil(size={"shortest_edge": LLAVA_SIZE},
                                   crop_size={"height": LLAVA_SIZE, "width": LLAVA_SIZE})
    return _unchecked(LlavaProcessor)(image_processor=images, tokenizer=tok, patch_size=14,
                                      vision_feature_select_strategy="default", num_additional_image_tokens=1)


def onevision_processor():
    """LlavaOnevisionProcessor on the word tokenizer: 28 px tiles, pinpoints up to 4 x 4 tiles (past anyres_max_9,
    so the model shrinks big grids), mean/std 0.5, the llava-hf chat template."""
    from transformers import LlavaOnevisionImageProcessorPil, LlavaOnevisionProcessor

    from vlmdata.testing import ONEVISION_TEMPLATE

    tok = word_tokenizer(ONEVISION_SPECIALS, eos="<|im_end|>", pad="<|endoftext|>")
    images = LlavaOnevisionImageProcessorPil(image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                             image_grid_pinpoints=ONEVISION_PINPOINTS,
                                             size={"height": ONEVISION_TILE, "width": ONEVISION_TILE})
    return _unchecked(LlavaOnevisionProcessor)(image_processor=images, tokenizer=tok, video_processor=None,
                                               num_image_tokens=(ONEVISION_TILE // 14) ** 2,
                                               vision_feature_select_strategy="full", chat_template=ONEVISION_TEMPLATE)


def write_onevision_folder(path: str, processor=None) -> str:
    """A tiny LLaVA-OneVision model and processor folder (SigLIP 1 layer, Qwen2 2 layers): config, image processor
    and processor settings, the word tokenizer and chat template (the text family reads them)."""
    import json

    from transformers import LlavaOnevisionConfig

    processor = processor or onevision_processor()
    tok = processor.tokenizer
    os.makedirs(path, exist_ok=True)
    LlavaOnevisionConfig(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=ONEVISION_TILE, patch_size=14),
        text_config=dict(model_type="qwen2", vocab_size=_vocab(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None),
        image_token_index=processor.image_token_id, video_token_index=processor.video_token_id,
        image_grid_pinpoints=ONEVISION_PINPOINTS, vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9").save_pretrained(path)
    tok.save_pretrained(path)
    ip = processor.image_processor
    files = {"preprocessor_config.json": {**ip.to_dict(), "processor_class": "LlavaOnevisionProcessor"},
             "processor_config.json": {"processor_class": "LlavaOnevisionProcessor",
                                       "num_image_tokens": processor.num_image_tokens,
                                       "vision_feature_select_strategy": "full", "vision_aspect_ratio": "anyres_max_9"},
             "chat_template.json": {"chat_template": processor.chat_template}}
    for name, data in files.items():
        with open(os.path.join(path, name), "w") as f:
            json.dump(data, f)
    return path


def onevision_text(processor, conv: Conversation) -> str:
    """The conversation through the processor's chat template (each user turn's images first)."""
    messages = []
    for role, text in conv.turns:
        images = [{"type": "image"}] * text.count("<image>")
        messages.append({"role": role, "content": images + [{"type": "text", "text": text.replace("<image> ", "")}]})
    return processor.apply_chat_template(messages, tokenize=False)


def internvl_processor():
    from transformers import GotOcr2ImageProcessorPil, InternVLProcessor

    from vlmdata.testing import INTERNVL_CHAT_TEMPLATE

    tok = word_tokenizer(INTERNVL_SPECIALS, eos="<|im_end|>", pad="<|endoftext|>", start_image_token="<img>",
                         end_image_token="</img>", context_image_token="<IMG_CONTEXT>", video_token="<video>")
    images = GotOcr2ImageProcessorPil(size={"height": INTERNVL_TILE, "width": INTERNVL_TILE},
                                      max_patches=INTERNVL_MAX_TILES, image_mean=[0.485, 0.456, 0.406],
                                      image_std=[0.229, 0.224, 0.225])
    return _unchecked(InternVLProcessor)(image_processor=images, tokenizer=tok, video_processor=None,
                                         image_seq_length=INTERNVL_PER_TILE, chat_template=INTERNVL_CHAT_TEMPLATE)


def _vocab(tokenizer) -> int:
    return 8 * -(-len(tokenizer) // 8)


def qwen_config(vocab_size: int, image_token_id: int, vision_start: int, vision_end: int, video_token_id: int):
    from transformers import Qwen2VLConfig

    return Qwen2VLConfig(
        text_config=dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
                         bos_token_id=None, eos_token_id=None, pad_token_id=None),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, mlp_ratio=2),
        image_token_id=image_token_id, video_token_id=video_token_id, vision_start_token_id=vision_start,
        vision_end_token_id=vision_end)


BYTE_VOCAB, BYTE_IMAGE = 262, 258      # the learnable corpus's byte tokenizer (tests.helpers.train.make_dataset)


def byte_corpus_qwen_ids() -> list[int]:
    """Qwen folder ids (image, vision start, vision end, video) for the byte corpus: its image token, and the word
    tokenizer's other three (the byte corpus never writes them)."""
    tok = qwen2_5_processor().tokenizer
    return [BYTE_IMAGE, *tok.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>", "<|video_pad|>"])]


def write_qwen_folder(path: str, processor=None, vocab_size: int | None = None, image_token_id: int | None = None,
                      pixels: tuple[int, int] = QWEN_PIXELS) -> str:
    """A tiny Qwen2-VL folder; ids from `processor`'s tokenizer unless given (e.g. a vlmdata dataset's)."""
    import json

    tok = (processor or qwen_processor()).tokenizer
    ids = tok.convert_tokens_to_ids(["<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>"])
    image = image_token_id if image_token_id is not None else ids[0]
    vocab = max(vocab_size or 0, _vocab(tok), image + 1)
    os.makedirs(path, exist_ok=True)
    qwen_config(vocab, image, ids[1], ids[2], ids[3]).save_pretrained(path)
    pre = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, "merge_size": 2,
           "temporal_patch_size": 2, "min_pixels": pixels[0], "max_pixels": pixels[1],
           "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump(pre, f)
    return path


def qwen3_config(vocab_size: int, image_token_id: int, vision_start: int, vision_end: int, video_token_id: int):
    """A tiny Qwen3-VL config: 2 text layers (interleaved M-RoPE), a 2-block vision tower (patch 16, one deepstack
    layer)."""
    from transformers import Qwen3VLConfig

    return Qwen3VLConfig(
        text_config=dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
                         rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True,
                                          "rope_theta": 10000.0}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=256,
                           deepstack_visual_indexes=[0]),
        image_token_id=image_token_id, vision_start_token_id=vision_start, vision_end_token_id=vision_end,
        video_token_id=video_token_id)


def write_qwen3_folder(path: str, processor=None, pixels: tuple[int, int] = QWEN3_PIXELS,
                       ids: list[int] | None = None, vocab_size: int | None = None) -> str:
    """A tiny Qwen3-VL folder (config from Qwen3VLConfig, preprocessor config from its image processor); `ids`
    (image, vision start, vision end, video) and `vocab_size` default to the processor's tokenizer."""
    import json

    tok = (processor or qwen3_processor()).tokenizer
    ids = ids or tok.convert_tokens_to_ids(["<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>"])
    os.makedirs(path, exist_ok=True)
    qwen3_config(vocab_size or _vocab(tok), *ids).save_pretrained(path)
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump(qwen3_image_processor(pixels).to_dict(), f)
    return path


def write_qwen2_5_folder(path: str, processor=None, ids: list[int] | None = None, vocab_size: int | None = None) -> str:
    """A tiny Qwen2.5-VL folder: windowed vision attention (one full-attention block), Qwen2-VL's text layout;
    `ids` (image, vision start, vision end, video) and `vocab_size` default to the processor's tokenizer."""
    import json

    from transformers import Qwen2_5_VLConfig

    processor = processor or qwen2_5_processor()
    tok = processor.tokenizer
    ids = ids or tok.convert_tokens_to_ids(["<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>"])
    os.makedirs(path, exist_ok=True)
    Qwen2_5_VLConfig(
        text_config=dict(vocab_size=vocab_size or _vocab(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64, window_size=56,
                           fullatt_block_indexes=[1]),
        image_token_id=ids[0], vision_start_token_id=ids[1], vision_end_token_id=ids[2], video_token_id=ids[3],
    ).save_pretrained(path)
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump(processor.image_processor.to_dict(), f)
    return path


def write_internvl_folder(path: str, processor=None) -> str:
    """A tiny InternVL3 folder: the processor's files and a randomly initialisable InternVLConfig (a 1-layer
    InternViT at 56 px, patch 14, and a 2-layer Qwen2)."""
    import json

    from transformers import InternVLConfig

    processor = processor or internvl_processor()
    tok = processor.tokenizer
    os.makedirs(path, exist_ok=True)
    tok.save_pretrained(path)
    processor.image_processor.save_pretrained(path)
    with open(os.path.join(path, "processor_config.json"), "w") as f:
        json.dump({"processor_class": "InternVLProcessor", "image_seq_length": processor.image_seq_length}, f)
    with open(os.path.join(path, "chat_template.json"), "w") as f:
        json.dump({"chat_template": processor.chat_template}, f)
    InternVLConfig(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=INTERNVL_TILE, patch_size=14),
        text_config=dict(model_type="qwen2", vocab_size=_vocab(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=8192, bos_token_id=None, eos_token_id=None, pad_token_id=None),
        image_token_id=processor.image_token_id, image_seq_length=processor.image_seq_length,
    ).save_pretrained(path)
    return path


def llava_config(vocab_size: int, image_token_id: int, image_size: int = LLAVA_SIZE):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=image_size, patch_size=14, projection_dim=32)
    text = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_token_id,
                       image_seq_length=(image_size // 14) ** 2, vision_feature_select_strategy="default",
                       vision_feature_layer=-2)


def write_llava_folder(path: str, processor=None, vocab_size: int | None = None, image_token_id: int | None = None,
                       image_size: int = LLAVA_SIZE) -> str:
    import json

    tok = (processor or llava_processor()).tokenizer
    image = image_token_id if image_token_id is not None else tok.convert_tokens_to_ids("<image>")
    vocab = max(vocab_size or 0, _vocab(tok), image + 1)
    os.makedirs(path, exist_ok=True)
    llava_config(vocab, image, image_size).save_pretrained(path)
    pre = {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": image_size},
           "crop_size": {"height": image_size, "width": image_size},
           "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump(pre, f)
    return path


def tiny_model(path: str, attn: str = "sdpa", seed: int = 0):
    """The folder's model, randomly initialised (seeded), fp32, eval mode (no dropout)."""
    from vlmdata.hf import load_model

    torch.manual_seed(seed)
    return load_model(path, attn_implementation=attn).eval()


# ---- conversations and reference packs ---------------------------------------------------------------------

@dataclass
class Conversation:
    key: str
    turns: list[tuple[str, str]]      # (role, text); "<image>" marks an image in a user turn
    images: list[bytes]               # JPEG bytes, in order
    sizes: list[tuple[int, int]]      # (width, height) of each image as stored


def make_conversations(n: int, seed: int = 0, max_images: int = 2, max_words: int = 40) -> list[Conversation]:
    """Multi-turn conversations with 0..max_images JPEGs of assorted sizes and aspect ratios."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(0, max_images + 1))
        images, sizes = [], []
        for _ in range(k):
            w, h = int(rng.integers(30, 400)), int(rng.integers(30, 400))
            arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(arr).save(buf, format="JPEG", quality=90)
            images.append(buf.getvalue())
            sizes.append((w, h))

        def words(lo=2, hi=max_words):
            return " ".join(WORDS[j] for j in rng.integers(0, len(WORDS), int(rng.integers(lo, hi))))

        turns = [("user", "<image> " * k + words(2, 8)), ("assistant", words())]
        for _ in range(int(rng.integers(0, 2))):
            turns += [("user", words(2, 6)), ("assistant", words())]
        out.append(Conversation(f"c{i:04d}", turns, images, sizes))
    return out


def qwen_text(conv: Conversation, image: str = "<|vision_start|><|image_pad|><|vision_end|>") -> str:
    """ChatML text of a conversation with `image` standing for each image (Qwen-VL's vision block)."""
    parts = ["<|im_start|>system a small picture<|im_end|>"]
    for role, text in conv.turns:
        text = text.replace("<image>", image)
        parts.append(f"<|im_start|>{role} {text}<|im_end|>")
    return " ".join(parts)


def internvl_text(conv: Conversation) -> str:
    return qwen_text(conv, image="<IMG_CONTEXT>")


def llava_text(conv: Conversation) -> str:
    parts = []
    for role, text in conv.turns:
        parts.append(f"USER: {text}" if role == "user" else f"ASSISTANT: {text} </s>")
    return "<s> " + " ".join(parts)


def idefics3_text(conv: Conversation) -> str:
    """Idefics3 / SmolVLM turns on the word tokenizer: each closed by <end_of_utterance>."""
    return " ".join(f"{'USER:' if role == 'user' else 'ASSISTANT:'} {text}<end_of_utterance>"
                    for role, text in conv.turns)


TEXTS = {"llava": llava_text, "internvl": internvl_text, "idefics3": idefics3_text, "smolvlm": idefics3_text}
CLOSERS = {"llava": ("ASSISTANT:", "</s>"), "idefics3": ("ASSISTANT:", "<end_of_utterance>"),
           "smolvlm": ("ASSISTANT:", "<end_of_utterance>")}


def assistant_labels(ids: np.ndarray, tokenizer, family: str) -> np.ndarray:
    """Labels: each assistant reply and the token that closes it; -100 elsewhere (and at position 0)."""
    chatml = family not in CLOSERS
    start, end = tokenizer.convert_tokens_to_ids(list(CLOSERS.get(family, ("<|im_start|>", "<|im_end|>"))))
    assistant = tokenizer.convert_tokens_to_ids("assistant")
    labels = np.full(len(ids), -100, np.int64)
    i, n = 0, len(ids)
    while i < n:
        if ids[i] == start and (not chatml or (i + 1 < n and ids[i + 1] == assistant)):
            j = i + (2 if chatml else 1)                     # after "ASSISTANT:" / "<|im_start|> assistant"
            while j < n:
                labels[j] = ids[j]
                if ids[j] == end:
                    break
                j += 1
            i = j + 1
        else:
            i += 1
    labels[0] = -100
    return labels


@dataclass
class Reference:
    """One sample as the processor makes it, and as vlmdata decodes it."""

    key: str
    processor_out: dict               # the processor's tensors for this sample alone
    ids: np.ndarray
    labels: np.ndarray
    decoded: list[np.ndarray]         # vlmdata-decoded images (H, W, 3) uint8 at the model's policy
    sizes: list[tuple[int, int]]


def references(convs: list[Conversation], processor, family: str, policy, exact: bool = False,
               resample: int = 3, text=None) -> list[Reference]:
    """Per conversation: the processor's tensors and vlmdata's decoded images. `exact`: vlmdata decodes with
    the processor-exact decoder and the processor gets the original images (as `load_image` opens them), so
    pixels are compared from the files; else the processor gets vlmdata's (fast) decoded images, already at
    the policy's size (how a fixed policy other than the processor's own is checked). `resample`: the exact
    decoder's filter (the folder's). `text(conv)`: the processor's text (default: the family's fixed layout).
    A per_sample policy's processor is given each sample's images as one list (as apply_chat_template gives
    them), and its decoder their count."""
    from transformers.image_utils import load_image

    from vlmdata.decode import make_decoder, sample_args

    decoder = (make_decoder("pillow", pixels="exact", crop=family == "llava", resample=resample) if exact
               else make_decoder("pillow"))
    text = text or TEXTS.get(family, qwen_text)
    nested = bool(sample_args(policy, None))
    out = []
    for conv in convs:
        counts = [len(conv.images)] * len(conv.images)
        decoded = decoder.decode(conv.images, conv.sizes, policy, *([counts] if nested else [])) if conv.images else []
        if exact:
            pil = [load_image(Image.open(io.BytesIO(b))) for b in conv.images] or None
        else:
            pil = [Image.fromarray(d) for d in decoded] or None
        got = processor(text=[text(conv)], images=[pil] if nested and pil else pil, return_tensors="pt")
        ids = got["input_ids"][0].numpy().astype(np.int64)
        out.append(Reference(conv.key, dict(got), ids, assistant_labels(ids, processor.tokenizer, family), decoded,
                             list(conv.sizes)))
    return out


def reference_pack(refs: list[Reference], policy, image_token_id: int, pad_token_id: int = 0,
                   mode: str = "pack") -> dict:
    """The PackedBatch of these samples (vlmdata's collate: pixels laid out as in training)."""
    from vlmdata.loading import CollateConfig, PreparedSample, collate_bucket, collate_pack
    from vlmdata.metrics import StatsDelta

    cfg = CollateConfig(policy=policy, image_token_id=image_token_id, pad_token_id=pad_token_id, max_tokens=1 << 20)
    samples = [PreparedSample(r.key, r.ids, r.labels, list(r.decoded), list(r.sizes)) for r in refs]
    collate = collate_pack if mode == "pack" else collate_bucket
    return collate(samples, cfg, StatsDelta())


# ---- packed against one by one ------------------------------------------------------------------------------

def label_count(refs) -> int:
    """Label tokens of these samples (what a packed loss is divided by)."""
    return sum(int((torch.as_tensor(r.labels[1:]) != -100).sum()) for r in refs)


def _grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def run_packed(model, inputs: dict, count: int) -> tuple[float, dict]:
    model.zero_grad(set_to_none=True)
    loss = model(**inputs, num_items_in_batch=count).loss
    loss.backward()
    return float(loss.detach()), _grads(model)


def run_one_by_one(model, refs, count: int) -> tuple[float, dict]:
    model.zero_grad(set_to_none=True)
    total = 0.0
    for r in refs:
        out = model(**r.processor_out, labels=torch.as_tensor(r.labels)[None], num_items_in_batch=count)
        out.loss.backward()
        total += float(out.loss.detach())
    return total, _grads(model)


def shift_one_boundary(inputs: dict) -> dict:
    """`inputs` with sample 0's end moved half way into sample 1 (boundaries only: the 4-D mask is dropped)."""
    from vlmdata.hf import flash_kwargs

    cu = inputs["cu_seq_lens_q"].clone()
    cu[1] += int(cu[2] - cu[1]) // 2
    bad = dict(inputs, **flash_kwargs(cu, int((cu[1:] - cu[:-1]).max())))
    bad.pop("attention_mask", None)
    return bad


def check_packed_equals_alone(folder: str, spec, refs, attn: str, tol: float = 1e-5) -> None:
    """The pack's loss and gradients through the folder's tiny model equal the sum over its samples run alone
    (relative `tol`), the vision tower is trained, and a boundary moved into the next sample breaks the equality."""
    from tests.helpers.train import assert_grads_close
    from vlmdata.hf import attention_kind, block_causal_mask

    model = tiny_model(folder, attn=attn)
    count = label_count(refs)
    packed_loss, packed_grads = run_packed(model, packed_inputs(spec, refs, attn), count)
    alone_loss, alone_grads = run_one_by_one(model, refs, count)
    assert abs(packed_loss - alone_loss) <= tol * max(1.0, abs(alone_loss))
    assert_grads_close(packed_grads, alone_grads, rel=tol)
    assert any(n.startswith(("model.visual", "model.vision_tower")) for n in packed_grads)     # images trained
    shifted = shift_one_boundary(packed_inputs(spec, refs, attn))
    if attention_kind(attn) == "masked":
        shifted["attention_mask"] = block_causal_mask(shifted["cu_seq_lens_q"], shifted["input_ids"].shape[1])
    wrong_loss, _ = run_packed(model, shifted, count)
    assert abs(wrong_loss - alone_loss) > tol * max(1.0, abs(alone_loss))               # the check can fail


def packed_inputs(spec, refs, attn: str) -> dict:
    """The forward inputs of these samples packed: vlmdata's collate, then the family's output adapter."""
    from vlmdata.hf import make_adapter, take_meta

    adapter = make_adapter(spec, attn)
    host = adapter(reference_pack(refs, spec.image_policy(), spec.image_token_id))
    take_meta(host)
    return adapter.finalize(host)


def accelerate_launch(args: list[str], nproc: int = 2, timeout: float = 600):
    """`accelerate launch` of NPROC processes (CPU: gloo, via --multi_gpu's torch.distributed launcher) from the
    repo root; raises with the output on failure."""
    import socket
    import sys

    from tests.helpers.paths import REPO
    from tests.helpers.processes import run_group

    with socket.socket() as s:                                   # a free port: other suites may hold 29500
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(nproc),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(port), *args]
    proc = run_group(cmd, timeout=timeout, cwd=REPO, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"accelerate launch failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-6000:]}")
    return proc
