"""ModelSpec read from model folders: Qwen2-VL and LLaVA-1.5 files, defaults, disagreements, bad folders."""
from __future__ import annotations

import json

import pytest

from tests.helpers.hf import QWEN_PIXELS, write_llava_folder, write_qwen_folder
from vlmdata.decode import DynamicPolicy, FixedPolicy
from vlmdata.errors import ConfigError
from vlmdata.hf import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, ModelSpec


def _edit(path, name, **changes):
    file = path / name
    data = json.loads(file.read_text())
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    file.write_text(json.dumps(data))


def test_qwen_folder(tmp_path):
    write_qwen_folder(str(tmp_path), vocab_size=300, image_token_id=258)
    spec = ModelSpec.from_folder(str(tmp_path))
    assert spec.family == "qwen2-vl" and spec.is_qwen
    assert (spec.image_token_id, spec.vocab_size) == (258, 300)
    assert (spec.patch_size, spec.merge_size, spec.temporal_patch_size) == (14, 2, 2)
    assert (spec.min_pixels, spec.max_pixels) == QWEN_PIXELS
    assert spec.image_mean == OPENAI_CLIP_MEAN and spec.image_std == OPENAI_CLIP_STD
    assert spec.image_policy() == DynamicPolicy(patch=14, merge=2, min_pixels=QWEN_PIXELS[0],
                                                max_pixels=QWEN_PIXELS[1])
    assert ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_qwen_size_keys_and_defaults(tmp_path):
    write_qwen_folder(str(tmp_path))
    _edit(tmp_path, "preprocessor_config.json", min_pixels=None, max_pixels=None,
          size={"shortest_edge": 1000, "longest_edge": 90000}, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    spec = ModelSpec.from_folder(str(tmp_path))
    assert (spec.min_pixels, spec.max_pixels) == (1000, 90000)
    assert spec.image_mean == (0.5, 0.5, 0.5)
    (tmp_path / "preprocessor_config.json").unlink()                 # config-only folder: processor defaults
    spec = ModelSpec.from_folder(str(tmp_path))
    assert (spec.min_pixels, spec.max_pixels) == (56 * 56, 28 * 28 * 1280)
    assert spec.image_mean == OPENAI_CLIP_MEAN


def test_qwen25_family(tmp_path):
    write_qwen_folder(str(tmp_path))
    _edit(tmp_path, "config.json", model_type="qwen2_5_vl")
    assert ModelSpec.from_folder(str(tmp_path)).family == "qwen2.5-vl"


def test_llava_folder(tmp_path):
    write_llava_folder(str(tmp_path), vocab_size=300, image_token_id=258)
    spec = ModelSpec.from_folder(str(tmp_path))
    assert spec.family == "llava" and not spec.is_qwen
    assert (spec.image_token_id, spec.image_size, spec.patch_size) == (258, 336, 14)
    assert spec.image_policy() == FixedPolicy(size=336, patch=14, merge=1)
    assert spec.image_policy().tokens_per_image == 576


def test_llava_old_image_token_name(tmp_path):
    write_llava_folder(str(tmp_path))
    data = json.loads((tmp_path / "config.json").read_text())
    data["image_token_index"] = data.pop("image_token_id", data.get("image_token_index"))
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert ModelSpec.from_folder(str(tmp_path)).image_token_id == data["image_token_index"]


def test_bad_folders(tmp_path):
    with pytest.raises(ConfigError, match="config.json does not exist"):
        ModelSpec.from_folder(str(tmp_path))
    write_qwen_folder(str(tmp_path))
    _edit(tmp_path, "preprocessor_config.json", merge_size=4)
    with pytest.raises(ConfigError, match="disagree on merge_size"):
        ModelSpec.from_folder(str(tmp_path))
    _edit(tmp_path, "config.json", model_type="mllama")
    with pytest.raises(ConfigError, match="mllama.*no vlmdata output adapter"):
        ModelSpec.from_folder(str(tmp_path))
    llava = tmp_path / "llava"
    write_llava_folder(str(llava))
    _edit(llava, "config.json", vision_feature_select_strategy="full")
    with pytest.raises(ConfigError, match="keeps the CLS token"):
        ModelSpec.from_folder(str(llava))
    (llava / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        ModelSpec.from_folder(str(llava))


def test_dataset_checks():
    spec = ModelSpec(family="qwen2-vl", image_token_id=151655, vocab_size=151936, merge_size=2,
                     temporal_patch_size=2, min_pixels=3136, max_pixels=50176)
    byte_tokenizer = {"name": "vlmdata-bytes-v1", "vocab_size": 262, "special": {"image": 258}}
    with pytest.raises(ConfigError, match="token id 258.*image_token_id=151655"):
        spec.check_tokenizer(byte_tokenizer)
    spec.check_tokenizer({"name": "qwen", "vocab_size": 151665, "special": {"image": 151655}})
    with pytest.raises(ConfigError, match="200000 ids"):
        spec.check_tokenizer({"name": "big", "vocab_size": 200000, "special": {"image": 151655}})
    spec.check_policy(spec.image_policy())
    with pytest.raises(ConfigError, match="does not match"):
        spec.check_policy(FixedPolicy(336))
    with pytest.raises(ConfigError, match="min_pixels"):
        ModelSpec(family="qwen2-vl", image_token_id=1)
    with pytest.raises(ConfigError, match="unknown model family"):
        ModelSpec(family="gpt", image_token_id=1)
