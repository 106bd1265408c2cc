"""The training loop in one process (a 1-rank gloo group): metrics endpoint, checkpoint layout,
resume across an epoch boundary with the real dataset, dynamic resolution, empty packs."""
import json
import os
import urllib.request

import pytest
import torch

from tests.helpers.train import make_dataset
from vlmdata_pipelines.checkpoint import latest_checkpoint, load_checkpoint
from vlmdata_pipelines.data import DataOptions, DatasetSource, ListSource, model_fields_for
from vlmdata_pipelines.model import TinyVLM, VLMConfig
from vlmdata_pipelines.packs import synthetic_pack
from vlmdata_pipelines.train import TrainConfig, Trainer, init_distributed, train


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(str(tmp_path_factory.mktemp("corpus")), samples=16, seed=3)


def _synthetic_packs(cfg):
    empty = {"input_ids": torch.zeros(1, dtype=torch.long), "labels": torch.full((1,), -100),
             "position_ids": torch.zeros(1, dtype=torch.long), "cu_seqlens": torch.tensor([0, 1], dtype=torch.int32),
             "max_seqlen": 1, "sample_keys": [], "pixel_values": torch.zeros(0, 3, 28, 28, dtype=torch.uint8),
             "stats": {"packs": 1, "padded_tokens": 1}}
    packs = [synthetic_pack([40, 25, 60], [1, 0, 2], cfg, 28, seed=i) for i in range(3)]
    for p in packs:
        p["sample_keys"] = ["a", "b", "c"]
        p["stats"] = {"samples": 3, "images": 3, "real_tokens": int(p["cu_seqlens"][-1]), "packs": 1}
    return packs + [empty]


def test_metrics_endpoint_and_step_records(tmp_path):
    cfg = VLMConfig.tiny()
    trainer = Trainer(TrainConfig(steps=4, metrics_port=0, out_dir=str(tmp_path)), cfg, init_distributed())
    try:
        result = trainer.run(ListSource(_synthetic_packs(cfg)))
        body = urllib.request.urlopen(trainer.metrics_url, timeout=10).read().decode()
    finally:
        trainer.close()
    assert 'vlmdata_steps_total{rank="0"} 4.0' in body
    assert 'vlmdata_samples_total{rank="0"} 9.0' in body  # absorbed from the packs' stats
    assert "vlmdata_data_wait_seconds_total" in body and "vlmdata_step_seconds_total" in body
    steps = [json.loads(x) for x in open(tmp_path / "steps.rank0.jsonl")]
    assert [s["samples"] for s in steps] == [3, 3, 3, 0]  # the empty pack counts no sample
    assert steps[3]["real_tokens"] == 0 and steps[3]["label_tokens"] == 0 and steps[3]["loss"] == 0.0
    assert result["loader_stats"]["samples"] == 9
    assert 0 <= result["data_wait_fraction"] < 1


def test_resume_across_epoch_boundary_with_dataset(dataset, tmp_path):
    """DatasetSource rolls over epochs; a checkpoint taken mid-run resumes at the same pack."""
    opts = DataOptions(data=dataset, max_tokens=512, image_size=28, num_workers=0)
    model_cfg = VLMConfig.tiny(**model_fields_for(opts))
    def source(info):
        return DatasetSource(opts, info.rank, info.world_size)
    packs_per_epoch = sum(1 for _ in DatasetSource(opts, 0, 1).dataset)
    steps = packs_per_epoch + 3
    full = train(TrainConfig(steps=steps, out_dir=str(tmp_path / "full")), model_cfg, source)
    stop = packs_per_epoch - 1  # the checkpoint is one pack before the epoch ends
    ckpt = str(tmp_path / "ckpt")
    train(TrainConfig(steps=steps, ckpt_dir=ckpt, stop_after=stop), model_cfg, source)
    resumed = train(TrainConfig(steps=steps, ckpt_dir=ckpt, resume=True, out_dir=str(tmp_path / "resumed")),
                    model_cfg, source)
    assert resumed["start_step"] == stop
    assert resumed["losses"] == full["losses"][stop:]
    assert resumed["checksum"] == full["checksum"]


def test_dynamic_resolution_training(dataset, tmp_path):
    opts = DataOptions(data=dataset, max_tokens=512, image_size="dynamic", num_workers=0)
    fields = model_fields_for(opts)
    assert fields["merge"] == 2
    result = train(TrainConfig(steps=4), VLMConfig.tiny(**fields),
                   lambda info: DatasetSource(opts, info.rank, info.world_size))
    assert result["images"] > 0 and result["losses"][-1] < result["losses"][0]


def test_checkpoint_layout_and_world_size_check(tmp_path):
    cfg = VLMConfig.tiny()
    ckpt = tmp_path / "ckpt"
    train(TrainConfig(steps=4, ckpt_dir=str(ckpt), ckpt_every=2), cfg, lambda info: ListSource(_synthetic_packs(cfg)))
    assert latest_checkpoint(str(ckpt)) == str(ckpt / "step_000004")
    assert sorted(p for p in os.listdir(ckpt) if p.startswith("step_")) == ["step_000002", "step_000004"]
    assert not [p for p in os.listdir(ckpt) if p.startswith(".tmp")]
    meta = json.load(open(ckpt / "step_000004" / "train.json"))
    assert meta["step"] == 4 and meta["data"] == [{"consumed": 4}]
    # a checkpoint written by another number of ranks is refused with a clear message
    meta["world_size"] = 2
    (ckpt / "step_000004" / "train.json").write_text(json.dumps(meta))
    init_distributed()
    model = TinyVLM(cfg)
    with pytest.raises(ValueError, match="written by 2 ranks"):
        load_checkpoint(str(ckpt / "step_000004"), model, torch.optim.AdamW(model.parameters()))


def test_activation_checkpointing_gives_the_same_gradients():
    cfg = VLMConfig.tiny()
    pack = synthetic_pack([40, 25, 60], [1, 0, 2], cfg, 28, seed=4)
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = TinyVLM(VLMConfig.tiny(activation_checkpointing=ckpt))
        loss, _ = model(pack)
        loss.backward()
        grads.append({k: p.grad for k, p in model.named_parameters()})
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], rtol=1e-5, atol=1e-7)


def test_image_budget_defaults_to_the_datasets_policy():
    """No --max-images: the dataset's image policy decides (16 images for fixed size, a patch budget for
    dynamic resolution), as for VLMDataset itself; an explicit cap is passed through."""
    from vlmdata_pipelines.train import build_parser

    assert build_parser().parse_args(["--data", "ds"]).max_images is None
    assert build_parser().parse_args(["--data", "ds", "--max-images", "4"]).max_images == 4
    assert DataOptions(data="ds").max_images is None
