"""Checks every Qwen-VL generation's family passes against its own Hugging Face processor: the vision settings,
image-token counts for 10^4 random sizes, the chat template's rendering, and the ids, trained positions, pixels and
grids of the reference corpus sharded and then loaded with the defaults (the last two serve every ChatML family
with Qwen2's ids, InternVL too)."""
from __future__ import annotations

import json

import numpy as np
import torch

from tests.helpers.exact_pixels import max_diff, processor_pixels
from tests.helpers.models import (
    chatml_assistant_positions,
    reference_conversations,
    samples_of,
    shard_reference_rows,
)
from tests.helpers.sizes import log_uniform_sizes
from vlmdata import VLMDataset
from vlmdata.hf import ModelSpec, make_adapter, take_meta
from vlmdata.text import Conversation
from vlmdata.text.families import load_family

IM_START, IM_END = 151644, 151645


def check_vision_settings(folder, processor, family: str, patch: int) -> None:
    fam = load_family(str(folder))
    assert fam.name == family
    v, ip = fam.vision, processor.image_processor
    ids = processor.tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|vision_start|>", "<|vision_end|>"])
    assert processor.image_token_id == ids[0]
    assert [v.image_token_id, v.vision_start_id, v.vision_end_id] == ids
    assert (v.patch_size, v.merge_size, v.temporal_patch_size) == (ip.patch_size, ip.merge_size,
                                                                  ip.temporal_patch_size) == (patch, 2, 2)
    assert v.image_mean == tuple(ip.image_mean) and v.image_std == tuple(ip.image_std)
    assert (v.min_pixels, v.max_pixels) == (ip.size["shortest_edge"], ip.size["longest_edge"])
    assert v.resample == int(ip.resample)


def check_token_counts(folder, processor, seed: int) -> None:
    """The family's planned image tokens equal the processor's for 10^4 sizes of 1 to 8,000 px (log-uniform)."""
    ip = processor.image_processor
    policy = load_family(str(folder)).vision.image_policy()
    w, h = log_uniform_sizes(10_000, seed, 8000, max_ratio=200)   # the processor refuses ratios of 200 and more
    assert len(w) == 10_000 and w.min() < ip.patch_size and w.max() > 4000
    want = np.array([ip.get_number_of_image_patches(int(b), int(a)) // 4 for a, b in zip(w, h)])
    assert np.array_equal(policy.tokens(w, h), want)


def check_rendering(folder, processor) -> None:
    fam = load_family(str(folder))
    for messages, n in reference_conversations():
        assert fam.render(Conversation(messages, n))[0] == processor.apply_chat_template(messages, tokenize=False)


def image_by_image(processor, inputs: dict, samples: list[list[bytes]]) -> tuple[float, int]:
    """(worst difference, images compared) of a pack's pixel inputs against the processor's, image by image; the
    grids too where the processor gives them."""
    refs = [processor_pixels(processor, data) for files in samples for data in files]
    if not refs:
        return 0.0, 0
    if "image_grid_thw" in refs[0]:
        assert torch.equal(inputs["image_grid_thw"], torch.cat([r["image_grid_thw"] for r in refs]))
    return max_diff(inputs["pixel_values"], torch.cat([r["pixel_values"] for r in refs])), len(refs)


def chatml_trained(processor):
    """`trained(ref ids)`: the positions a ChatML template trains (each assistant reply and its <|im_end|>)."""
    header = processor.tokenizer.encode("assistant\n", add_special_tokens=False)
    return lambda ref: chatml_assistant_positions(ref, IM_START, IM_END, header)


def check_sharded_and_loaded(folder, processor, family: str, tmp_path, pixels=image_by_image,
                             nested: bool = False, render=None, trained=None, max_tokens: int = 1 << 16) -> None:
    """Shard the reference rows with the folder, load them with the defaults: pixels (`pixels(processor, inputs,
    per-sample image files)` through the family's adapter), ids and trained positions equal the processor's
    (given each sample's images as one list when `nested`, as apply_chat_template gives them). `render(messages)`:
    the processor's text (default its `apply_chat_template`); `trained(ref ids)`: the positions the template
    trains (default ChatML's)."""
    rows, expected, data = shard_reference_rows(tmp_path, folder, max_samples_per_shard=4)
    ds = VLMDataset(str(data), max_tokens=max_tokens, rank=0, world_size=1)
    assert ds.model_family.name == family and ds.pixels == "exact"
    adapter = make_adapter(ModelSpec.from_dataset(ds))
    files = {json.loads(line)["id"]: json.loads(line)["images"] for line in rows.read_text().splitlines()}
    got, worst, compared = {}, 0.0, 0
    for pack in ds:
        got.update(samples_of(pack))
        host = adapter(pack)
        keys = take_meta(host)["sample_keys"]
        diff, n = pixels(processor, adapter.finalize(host), [[(rows.parent / f).read_bytes() for f in files[k]]
                                                            for k in keys])
        worst, compared = max(worst, diff), compared + n
    assert compared > 0 and worst <= 1e-5
    render = render or (lambda messages: processor.apply_chat_template(messages, tokenize=False))
    trained = trained or chatml_trained(processor)
    for n, (messages, images) in enumerate(expected):
        given = ([images] if nested else images) if images else None
        ref = processor(text=[render(messages)], images=given, return_tensors="np")["input_ids"][0]
        ids, labels = got[f"conv{n}"]
        assert np.array_equal(ids, ref), f"conv{n}"
        want = trained(ref)
        assert want.any() and np.array_equal(labels != -100, want), f"conv{n}"
        assert np.array_equal(labels[want], ref[want])
