"""load_model: random initialisation from config.json or the folder's weights, packed attention, no KV cache."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.hf import write_llava_folder, write_qwen_folder
from vlmdata.errors import ConfigError
from vlmdata.hf import VARLEN_ATTENTION, choose_attention, has_weights, load_model


def test_random_init_then_weights(tmp_path):
    folder = write_qwen_folder(str(tmp_path / "cfg"))
    assert not has_weights(folder)
    torch.manual_seed(1)
    model = load_model(folder)
    assert model.config.get_text_config()._attn_implementation == VARLEN_ATTENTION    # CPU: vlmdata_varlen
    assert model.config.use_cache is False and model.config.get_text_config().use_cache is False
    torch.manual_seed(1)
    again = load_model(folder, attn_implementation="sdpa")
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))   # seeded
    model.save_pretrained(str(tmp_path / "trained"))
    for name in ("config.json", "preprocessor_config.json"):
        (tmp_path / "trained" / name).write_bytes((tmp_path / "cfg" / name).read_bytes())
    assert has_weights(str(tmp_path / "trained"))
    torch.manual_seed(2)
    loaded = load_model(str(tmp_path / "trained"), attn_implementation="eager")
    state = model.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in loaded.state_dict().items())


def test_llava_and_attention_choice(tmp_path):
    model = load_model(write_llava_folder(str(tmp_path), image_size=56), attn_implementation="sdpa")
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    assert choose_attention("cpu") == VARLEN_ATTENTION
    assert choose_attention("cpu", "eager") == "eager"
    with pytest.raises(ConfigError, match="CUDA only"):
        choose_attention("cpu", "flash_attention_2")
