"""The generic family through its output adapter and a tiny random LLaVA-NeXT (LlavaNextForConditionalGeneration
built from the folder's config, fp32, CPU): the packed batch's loss and gradients equal the sum over its samples
run alone through the processor's own inputs (1e-5), and a moved boundary fails that check."""
from __future__ import annotations

import json
import math

import pytest
import torch

from tests.helpers.hf import run_packed, tiny_model
from tests.helpers.models import samples_of, shard_reference_rows
from tests.helpers.train import assert_grads_close
from vlmdata import VLMDataset
from vlmdata.hf import ModelSpec, VLMTrainer, block_causal_mask, flash_kwargs, make_adapter, take_meta
from vlmdata.testing import llava_next_folder

TOL = 1e-5


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """(folder, dataset dir, per row (messages, images)) of the reference corpus sharded with a tiny LLaVA-NeXT."""
    folder = llava_next_folder(tmp_path_factory.mktemp("llava_next_tiny"), side=56)
    tmp = tmp_path_factory.mktemp("data")
    _, expected, data = shard_reference_rows(tmp, folder)
    return folder, str(data), expected


@pytest.fixture(scope="module")
def packed(sharded):
    from transformers import AutoProcessor

    folder, ds_dir, expected = sharded
    ds = VLMDataset(ds_dir, max_tokens=1 << 16, rank=0, world_size=1)
    spec = ModelSpec.from_folder(str(folder))
    assert spec.family == "generic" and spec.image_policy() == ModelSpec.from_dataset(ds).image_policy()
    pack = next(iter(ds))
    assert len(pack["sample_keys"]) >= 3
    proc = AutoProcessor.from_pretrained(str(folder))
    by_key = {f"conv{n}": e for n, e in enumerate(expected)}
    alone = []
    for key, (ids, labels) in samples_of(pack).items():
        messages, images = by_key[key]
        out = proc.apply_chat_template(messages, tokenize=True, return_dict=True, images=images or None,
                                       return_tensors="pt")
        assert torch.equal(out["input_ids"][0], torch.as_tensor(ids))
        alone.append(({k: v for k, v in out.items() if k != "attention_mask"}, torch.as_tensor(labels)[None]))
    assert sum("pixel_values" in a for a, _ in alone) >= 2
    count = sum(int((lab[0, 1:] != -100).sum()) for _, lab in alone)
    return str(folder), spec, pack, alone, count


def _inputs(spec, pack, attn):
    adapter = make_adapter(spec, attn)
    host = adapter(dict(pack))
    take_meta(host)
    return adapter.finalize(host)


@pytest.mark.parametrize("attn", ["sdpa", "vlmdata_varlen"])
def test_packed_equals_sum_of_samples(packed, attn):
    folder, spec, pack, alone, count = packed
    model = tiny_model(folder, attn=attn)
    assert type(model).__name__ == "LlavaNextForConditionalGeneration"
    inputs = _inputs(spec, pack, attn)
    assert set(inputs) >= {"input_ids", "labels", "position_ids", "pixel_values", "image_sizes", "cu_seq_lens_q"}
    packed_loss, packed_grads = run_packed(model, inputs, count)
    model.zero_grad(set_to_none=True)
    total = 0.0
    for kwargs, labels in alone:
        out = model(**kwargs, labels=labels, num_items_in_batch=count)
        out.loss.backward()
        total += float(out.loss.detach())
    alone_grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    assert abs(packed_loss - total) <= TOL * max(1.0, abs(total))
    assert_grads_close(packed_grads, alone_grads, rel=TOL)
    assert any("vision_tower" in n for n in packed_grads)                  # images trained
    cu = inputs["cu_seq_lens_q"].clone()
    cu[1] += int(cu[2] - cu[1]) // 2                                       # sample 0 swallows half of sample 1
    shifted = dict(inputs, **flash_kwargs(cu, int((cu[1:] - cu[:-1]).max())))
    if attn == "sdpa":
        shifted["attention_mask"] = block_causal_mask(cu, shifted["input_ids"].shape[1])
    wrong_loss, _ = run_packed(model, shifted, count)
    assert abs(wrong_loss - total) > TOL * max(1.0, abs(total))          # the check can fail


def test_the_spec_travels_as_json(packed):
    _, spec, _, _, _ = packed
    back = ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert back.family == "generic" and back.image_policy() == spec.image_policy()


@pytest.mark.slow
def test_vlm_trainer_trains_every_sample_with_two_workers(sharded, tmp_path):
    from transformers import TrainingArguments

    folder, ds_dir, expected = sharded
    spec = ModelSpec.from_folder(str(folder))
    model = tiny_model(str(folder), attn="sdpa").train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ds = VLMDataset(ds_dir, max_tokens=512, image_size=spec.image_policy(), rank=0, world_size=1)
    keys: list[str] = []
    args = TrainingArguments(output_dir=str(tmp_path), num_train_epochs=1, per_device_train_batch_size=1,
                             learning_rate=1e-3, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                             report_to=[], use_cpu=True, dataloader_num_workers=2, disable_tqdm=True)
    trainer = VLMTrainer(model=model, args=args, train_dataset=ds, spec=spec,
                         on_pack=lambda meta: keys.extend(meta["sample_keys"]))
    trainer.train()
    assert sorted(k.rsplit("/", 1)[-1] for k in keys) == sorted(f"conv{n}" for n in range(len(expected)))
    assert trainer.loader_stats.images == sum(len(images) for _, images in expected) > 0
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == trainer.state.global_step >= 3 and all(math.isfinite(x) for x in losses)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert any("vision_tower" in n for n in changed) and any("language_model" in n for n in changed)
