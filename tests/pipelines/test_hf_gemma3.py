"""Gemma 3 in the reference loop (issue 21): HFPackedModel's loss sum on a sharded Gemma 3 pack equals the
model's own, text-only packs keep the vision tower in the graph, and `vlmdata_pipelines.train --model hf:DIR`
trains a tiny Gemma 3 on a dataset sharded with its folder."""
from __future__ import annotations

import json
import math

import pytest
import torch

from tests.helpers.gemma3 import shard_corpus
from tests.helpers.train import text_only_step
from vlmdata.hf import make_adapter, take_meta
from vlmdata.loading import VLMDataset
from vlmdata.testing import gemma3_folder
from vlmdata_pipelines.hf_model import HFModelConfig, HFPackedModel
from vlmdata_pipelines.train import main

SIZES = [(640, 480), (3, 2), (500, 40), (40, 300), (224, 224), (97, 211)]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3-loop")
    folder = gemma3_folder(root / "model", image_size=224, tokens_per_image=16, tiny=True, sliding_window=24)
    _, _, data = shard_corpus(folder, root, sizes=SIZES)
    return str(folder), str(data)


def test_loss_sum_equals_the_models_own(gemma):
    folder, data = gemma
    torch.manual_seed(0)
    wrapped = HFPackedModel(HFModelConfig(folder, "auto"))
    assert wrapped.adapter.attn_implementation == "sdpa"
    pack = next(iter(VLMDataset(data, max_tokens=1 << 16, max_images=64, rank=0, world_size=1)))
    loss_sum, count = wrapped(pack)
    adapter = make_adapter(wrapped.spec, "sdpa")
    host = adapter(dict(pack))
    take_meta(host)
    want = wrapped.model(**adapter.finalize(host), num_items_in_batch=1).loss
    assert int(count) == int((pack["labels"][1:] != -100).sum()) > 0
    torch.testing.assert_close(loss_sum, want, rtol=1e-5, atol=1e-5)
    assert text_only_step(wrapped, (2, 5, 6, 7, 8, 9))[0] == []


def test_train_hf_gemma3_from_the_command_line(gemma, tmp_path):
    folder, data = gemma
    out = tmp_path / "out"
    assert main(["--data", data, "--model", f"hf:{folder}", "--steps", "6", "--max-tokens", "512",
                 "--num-workers", "1", "--lr", "3e-3", "--out", str(out)]) == 0
    result = json.load(open(out / "result.rank0.json"))
    assert result["steps"] == list(range(6)) and result["images"] > 0
    assert all(math.isfinite(v) for v in result["losses"])
