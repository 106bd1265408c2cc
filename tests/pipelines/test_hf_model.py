"""A Hugging Face VLM in the reference loop: HFPackedModel's loss equals the model's own, DDP-safe graphs, FSDP
units, and `vlmdata_pipelines.train --model hf:DIR` trains on a vlmdata dataset."""
from __future__ import annotations

import json
import math

import pytest
import torch

from tests.helpers.hf import (
    BYTE_IMAGE,
    BYTE_VOCAB,
    byte_corpus_qwen_ids,
    make_conversations,
    onevision_processor,
    onevision_text,
    qwen_processor,
    reference_pack,
    references,
    write_llava_folder,
    write_onevision_folder,
    write_qwen2_5_folder,
    write_qwen3_folder,
    write_qwen_folder,
)
from tests.helpers.train import make_dataset, text_only_step
from vlmdata.errors import ConfigError
from vlmdata.hf import make_adapter, take_meta
from vlmdata_pipelines.hf_model import HFModelConfig, HFPackedModel
from vlmdata_pipelines.train import build_parser, configs_from_args, main


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(str(tmp_path_factory.mktemp("corpus")), samples=24, seed=5, shard_size=12)


def test_loss_sum_equals_the_models_own(tmp_path):
    proc = qwen_processor()
    folder = write_qwen_folder(str(tmp_path), proc)
    torch.manual_seed(0)
    wrapped = HFPackedModel(HFModelConfig(folder, "sdpa"))
    spec = wrapped.spec
    refs = references(make_conversations(4, seed=9), proc, "qwen2-vl", spec.image_policy())
    pack = reference_pack(refs, spec.image_policy(), spec.image_token_id)
    loss_sum, count = wrapped(pack)
    adapter = make_adapter(spec, "sdpa")
    host = adapter(pack)
    take_meta(host)
    want = wrapped.model(**adapter.finalize(host), num_items_in_batch=1).loss     # sum over label tokens
    assert int(count) == int((pack["labels"][1:] != -100).sum())
    torch.testing.assert_close(loss_sum, want, rtol=1e-5, atol=1e-5)


def test_packs_without_images_keep_every_parameter_in_the_graph(tmp_path):
    wrapped = HFPackedModel(HFModelConfig(write_qwen_folder(str(tmp_path)), "vlmdata_varlen"))
    assert wrapped.frozen == []
    assert text_only_step(wrapped) == ([], 5)
    assert len(wrapped.fsdp_units()) == 2 + 1                                      # 2 decoder + 1 vision block


def test_a_tiled_family_llava_onevision(tmp_path):
    """LLaVA-OneVision (tiled, anyres): the loss sum equals the model's own on a pack of lone and multi-image
    samples, and a pack without images still reaches every trainable parameter (the probe image's tiles)."""
    proc = onevision_processor()
    folder = write_onevision_folder(str(tmp_path), proc)
    torch.manual_seed(0)
    wrapped = HFPackedModel(HFModelConfig(folder, "sdpa"))
    spec = wrapped.spec
    refs = references(make_conversations(4, seed=48, max_images=3), proc, spec.family, spec.image_policy(),
                      exact=True, text=lambda conv: onevision_text(proc, conv))
    pack = reference_pack(refs, spec.image_policy(), spec.image_token_id)
    loss_sum, count = wrapped(pack)
    adapter = make_adapter(spec, "sdpa")
    host = adapter(pack)
    take_meta(host)
    torch.testing.assert_close(loss_sum, wrapped.model(**adapter.finalize(host), num_items_in_batch=1).loss,
                               rtol=1e-5, atol=1e-5)
    assert text_only_step(wrapped)[0] == []
    assert any("vision_tower" in n for n, p in wrapped.named_parameters() if p.grad is not None)


def test_train_llava_onevision_from_the_command_line(tmp_path):
    """A corpus sharded with the tiny LLaVA-OneVision's folder (lone and multi-image samples) trains with
    `--model hf:DIR`: finite losses over the steps, images seen."""
    from tests.helpers.models import shard_reference_rows

    folder = write_onevision_folder(str(tmp_path / "model"))
    _, _, data = shard_reference_rows(tmp_path, folder)
    out = tmp_path / "out"
    assert main(["--data", str(data), "--model", f"hf:{folder}", "--steps", "6", "--max-tokens", "2048",
                 "--num-workers", "1", "--lr", "3e-3", "--out", str(out)]) == 0
    result = json.load(open(out / "result.rank0.json"))
    assert result["steps"] == list(range(6)) and result["images"] > 0
    assert all(math.isfinite(x) for x in result["losses"])


def test_llava_unused_parameters_are_frozen(tmp_path):
    wrapped = HFPackedModel(HFModelConfig(write_llava_folder(str(tmp_path), image_size=56), "sdpa"))
    assert wrapped.frozen and all("vision_tower" in n for n in wrapped.frozen)
    assert any("post_layernorm" in n for n in wrapped.frozen)                      # features come from layer -2
    assert len(wrapped.fsdp_units()) == 2 + 2


QWEN_WRITERS = {
    "qwen2-vl": lambda path: write_qwen_folder(path, vocab_size=BYTE_VOCAB, image_token_id=BYTE_IMAGE),
    "qwen2.5-vl": lambda path: write_qwen2_5_folder(path, ids=byte_corpus_qwen_ids(), vocab_size=BYTE_VOCAB),
    "qwen3-vl": lambda path: write_qwen3_folder(path, ids=byte_corpus_qwen_ids(), vocab_size=BYTE_VOCAB),
}


@pytest.mark.parametrize("family", list(QWEN_WRITERS))
def test_train_hf_model_from_the_command_line(dataset, tmp_path, family):
    folder = QWEN_WRITERS[family](str(tmp_path / "qwen"))
    assert HFModelConfig(folder, "sdpa").spec.family == family
    out = tmp_path / "out"
    assert main(["--data", dataset, "--model", f"hf:{folder}", "--steps", "8", "--max-tokens", "512",
                 "--num-workers", "1", "--lr", "3e-3", "--out", str(out)]) == 0
    result = json.load(open(out / "result.rank0.json"))
    losses = result["losses"]
    assert result["steps"] == list(range(8)) and result["images"] > 0
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.3, losses


def test_command_line_checks(dataset, tmp_path):
    folder = write_qwen_folder(str(tmp_path / "qwen"), vocab_size=262, image_token_id=258)
    args = build_parser().parse_args(["--data", dataset, "--model", f"hf:{folder}", "--image-size", "56"])
    _, model_cfg, data = configs_from_args(args)
    assert isinstance(model_cfg, HFModelConfig) and model_cfg.image_token_id == 258
    assert data.policy() == model_cfg.spec.image_policy()                          # the model's, not --image-size
    other = write_qwen_folder(str(tmp_path / "other"))                             # the processor's own ids
    with pytest.raises(ConfigError, match="token id 258"):
        configs_from_args(build_parser().parse_args(["--data", dataset, "--model", f"hf:{other}"]))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--data", dataset, "--model", "gpt2"])


@pytest.mark.integration
@pytest.mark.slow
def test_two_ranks_ddp_with_llava(dataset, tmp_path):
    """DDP on 2 ranks (torchrun, gloo): LLaVA's CLIP layer that the features skip is frozen (DDP would wait for
    its gradients forever otherwise); the ranks stay in sync and the loss goes down."""
    from tests.helpers.train import torchrun

    folder = write_llava_folder(str(tmp_path / "llava"), vocab_size=262, image_token_id=258, image_size=56)
    out = tmp_path / "out"
    torchrun(["--nproc_per_node", "2", "-m", "vlmdata_pipelines.train", "--data", dataset, "--model", f"hf:{folder}",
              "--steps", "6", "--max-tokens", "512", "--num-workers", "1", "--lr", "3e-3", "--out", str(out)],
             timeout=600)
    r0, r1 = (json.load(open(out / f"result.rank{r}.json")) for r in range(2))
    assert r0["checksum"] == r1["checksum"] and r0["losses"] == r1["losses"]
    assert r0["losses"][-1] < r0["losses"][0] - 0.3, r0["losses"]
