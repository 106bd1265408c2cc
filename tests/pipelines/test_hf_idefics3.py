"""Idefics3 in the reference loop (`vlmdata_pipelines.train --model hf:DIR`): a tiled family's probe pack and the
dummy image of text-only packs go through its own image policy and adapter, every parameter stays in the graph,
and a tiny Idefics3 (and SmolVLM) trains from the command line on a dataset sharded with its folder."""
from __future__ import annotations

import json

import pytest

from tests.helpers.idefics3 import write_tiny_folder
from tests.helpers.train import text_only_step
from vlmdata_pipelines.hf_model import HFModelConfig, HFPackedModel
from vlmdata_pipelines.train import main


@pytest.fixture(scope="module", params=["idefics3", "smolvlm"])
def folder(request, tmp_path_factory):
    return str(write_tiny_folder(str(tmp_path_factory.mktemp(request.param) / "model"), request.param))


def test_packs_without_images_keep_every_parameter_in_the_graph(folder):
    wrapped = HFPackedModel(HFModelConfig(folder, "vlmdata_varlen"))
    assert wrapped.frozen == []
    probe = wrapped._probe_pack()
    assert int(probe["image_tiles"][0]) == probe["pixel_values"].shape[0] == 1 + 2 * 2   # 2 x 2 tiles + global
    assert text_only_step(wrapped) == ([], 5)


def test_train_idefics3_from_the_command_line(folder, tmp_path):
    from tests.helpers.models import shard_reference_rows

    _, _, data = shard_reference_rows(tmp_path, folder)
    out = tmp_path / "out"
    assert main(["--data", str(data), "--model", f"hf:{folder}", "--steps", "6", "--max-tokens", "1024",
                 "--num-workers", "1", "--lr", "3e-3", "--out", str(out)]) == 0
    result = json.load(open(out / "result.rank0.json"))
    losses = result["losses"]
    assert result["steps"] == list(range(6)) and result["images"] > 0
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.3, losses
