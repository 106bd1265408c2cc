"""VLMTrainer: transformers.Trainer on VLMDataset packs, in one process (every input reaches forward, each
sample once per epoch, clear errors) and under a real 2-process `accelerate launch` (CPU, gloo)."""
from __future__ import annotations

import json
import os

import pytest
import torch

from tests.helpers.hf import accelerate_launch, tiny_model, write_qwen_folder
from tests.helpers.train import make_dataset
from vlmdata.decode import FixedPolicy
from vlmdata.errors import ConfigError
from vlmdata.hf import ModelSpec, VLMTrainer, make_adapter
from vlmdata.loading import VLMDataset


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-trainer")
    data = make_dataset(str(root), samples=12, seed=7, shard_size=6)
    folder = write_qwen_folder(str(root / "qwen"), vocab_size=262, image_token_id=258)
    return data, folder


def _args(out, **kw):
    from transformers import TrainingArguments

    base = dict(output_dir=str(out), num_train_epochs=2, per_device_train_batch_size=1, learning_rate=1e-3,
                lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                dataloader_num_workers=0, disable_tqdm=True)
    base.update(kw)
    return TrainingArguments(**base)


def test_every_input_reaches_forward_and_each_sample_once_per_epoch(setup, tmp_path):
    data, folder = setup
    spec = ModelSpec.from_folder(folder)
    model = tiny_model(folder, attn="sdpa").train()
    calls = []
    forward = model.forward

    def spy(**kwargs):
        calls.append({k: (type(v).__name__, tuple(v.shape) if isinstance(v, torch.Tensor) else v)
                      for k, v in kwargs.items()})
        return forward(**kwargs)

    model.forward = spy
    ds = VLMDataset(data, max_tokens=512, image_size=spec.image_policy(), decoder="pillow", rank=0, world_size=1)
    keys: dict[int, list] = {}
    trainer = VLMTrainer(model=model, args=_args(tmp_path), train_dataset=ds, spec=spec,
                         on_pack=lambda m: keys.setdefault(m["state"]["epoch"], []).extend(m["sample_keys"]))
    loader = trainer.get_train_dataloader()
    assert len(loader) == ds.planner(0).total()
    trainer.train()
    everything = {f"{i:06d}" for i in range(12)}
    assert sorted(keys) == [0, 1]
    for epoch, got in keys.items():
        assert len(got) == 12 and {k[-6:] for k in got} == everything, epoch   # each sample once per epoch
    assert keys[0] != keys[1]                                                   # a new order each epoch
    with_images = [c for c in calls if "pixel_values" in c]
    assert calls and with_images
    for c in with_images:
        t = c["input_ids"][1][1]
        assert c["position_ids"][1] == (3, 1, t)                                # M-RoPE, per sample
        assert c["attention_mask"][1] == (1, 1, t, t)                           # sdpa: the block mask
        assert c["pixel_values"][1][1] == 3 * 2 * 14 * 14 and "image_grid_thw" in c
        assert {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "labels"} <= set(c)
        assert all(kind in ("Tensor", "int") for kind, _ in c.values())        # no strings, no lists
    assert trainer.loader_stats.samples == 24
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == trainer.state.global_step == 2 * ds.planner(0).total()


def test_why_plain_trainer_does_not_do(setup, tmp_path):
    """What the issue saw: plain Trainer keeps only forward's named arguments (remove_unused_columns) and
    stacks items with its default collator. VLMTrainer's loader uses neither."""
    from transformers import Trainer

    data, folder = setup
    spec = ModelSpec.from_folder(folder)
    model = tiny_model(folder, attn="sdpa")
    ds = VLMDataset(data, max_tokens=512, image_size=spec.image_policy(), rank=0, world_size=1)
    host = make_adapter(spec, "sdpa")(next(iter(ds)))
    plain = Trainer(model=model, args=_args(tmp_path))
    kept = plain._get_collator_with_removed_columns(lambda items: items[0], description="training")([host])
    assert "pixel_values" in kept and "image_grid_thw" in kept
    assert not {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"} & set(kept)   # boundaries lost
    ours = VLMTrainer(model=model, args=_args(tmp_path), train_dataset=ds, spec=spec).get_train_dataloader()
    assert ours.batch_size is None and "cu_seq_lens_q" in next(iter(ours))


def test_resume_reproduces_the_uninterrupted_run(setup, tmp_path):
    data, folder = setup
    spec = ModelSpec.from_folder(folder)
    ds = VLMDataset(data, max_tokens=512, image_size=spec.image_policy(), rank=0, world_size=1)
    cursors = []
    full = VLMTrainer(model=tiny_model(folder), args=_args(tmp_path, max_steps=4, save_strategy="steps", save_steps=2),
                      train_dataset=ds, spec=spec, on_pack=lambda m: cursors.append(m["state"]["cursor"]))
    full.train()
    resumed_cursors = []
    resumed = VLMTrainer(model=tiny_model(folder, seed=9), args=_args(tmp_path, max_steps=4), train_dataset=ds,
                         spec=spec, on_pack=lambda m: resumed_cursors.append(m["state"]["cursor"]))
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (full, resumed)]
    assert losses[0] == losses[1]                      # the weights (not the other seed's) and the data resumed
    assert resumed_cursors == cursors[2:]              # it trains the packs after the checkpoint, once


def test_clear_errors(setup, tmp_path):
    data, folder = setup
    spec = ModelSpec.from_folder(folder)
    model = tiny_model(folder, attn="sdpa")
    ds = VLMDataset(data, max_tokens=512, image_size=spec.image_policy(), rank=0, world_size=1)
    with pytest.raises(ConfigError, match="persistent"):
        VLMTrainer(model=model, args=_args(tmp_path, dataloader_num_workers=1, dataloader_persistent_workers=True),
                   train_dataset=ds, spec=spec)
    with pytest.raises(ConfigError, match="needs spec"):
        VLMTrainer(model=model, args=_args(tmp_path), train_dataset=ds)
    fixed = VLMDataset(data, max_tokens=512, image_size=FixedPolicy(56), rank=0, world_size=1)
    with pytest.raises(ConfigError, match="image policy"):
        VLMTrainer(model=model, args=_args(tmp_path), train_dataset=fixed, spec=spec)
    other = ModelSpec.from_dict(dict(spec.to_dict(), image_token_id=200))
    with pytest.raises(ConfigError, match="token id 258"):
        VLMTrainer(model=model, args=_args(tmp_path), train_dataset=ds, spec=other)


@pytest.mark.integration
@pytest.mark.slow
def test_accelerate_launch_two_processes(setup, tmp_path):
    data, folder = setup
    out = tmp_path / "run"
    accelerate_launch(["-m", "vlmdata_pipelines.hf_trainer", "--data", data, "--model", folder, "--out", str(out),
                       "--epochs", "2", "--max-tokens", "512", "--num-workers", "1", "--lr", "2e-3"])
    results = [json.load(open(os.path.join(out, f"result.rank{r}.json"))) for r in range(2)]
    assert [r["world_size"] for r in results] == [2, 2]
    for epoch in ("0", "1"):
        per_rank = [r["keys_by_epoch"][epoch] for r in results]
        assert all(per_rank)                                                    # both ranks trained
        assert not set(per_rank[0]) & set(per_rank[1])                          # no sample on both ranks
        both = per_rank[0] + per_rank[1]
        assert len(both) == len(set(both)) == 12                                # every sample exactly once
    assert results[0]["steps"] == results[1]["steps"]
    losses = results[0]["losses"]
    assert losses == results[1]["losses"]                                       # the logged loss is global
    n = max(2, len(losses) // 4)
    assert sum(losses[-n:]) / n < sum(losses[:n]) / n - 0.5, losses             # it learns
