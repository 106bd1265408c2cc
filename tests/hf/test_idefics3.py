"""Idefics3 and SmolVLM through the output adapter (issue 21), with the real transformers classes (Idefics3Processor /
SmolVLMProcessor, a tiny randomly initialised Idefics3ForConditionalGeneration / SmolVLMForConditionalGeneration,
fp32 on CPU): a pack's pixel_values [1, N, 3, S, S] equal the processor's (from the original files), its loss and
gradients equal the sum over its samples run alone (1e-5) and a moved boundary breaks that; VLMTrainer trains it."""
from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.hf import (
    label_count,
    make_conversations,
    packed_inputs,
    reference_pack,
    references,
    run_one_by_one,
    run_packed,
    tiny_model,
)
from tests.helpers.idefics3 import processor_of, write_tiny_folder
from tests.helpers.train import assert_grads_close
from vlmdata.hf import Idefics3Adapter, ModelSpec, block_causal_mask, flash_kwargs, make_adapter, take_meta

TOL = 1e-5


@pytest.fixture(scope="module", params=["idefics3", "smolvlm"])
def tiny(request, tmp_path_factory):
    family = request.param
    folder = write_tiny_folder(str(tmp_path_factory.mktemp(family) / "model"), family)
    proc = processor_of(folder, family)
    spec = ModelSpec.from_folder(str(folder))
    refs = references(make_conversations(6, seed=41, max_images=2), proc, family, spec.image_policy(), exact=True,
                      resample=1)
    assert sum(len(r.decoded) for r in refs) >= 4 and any(not r.decoded for r in refs)
    return family, str(folder), spec, refs


def test_spec_and_adapter(tiny):
    family, _, spec, _ = tiny
    assert spec.family == family and spec.policy["kind"] == "idefics3" and spec.policy["tile"] == 32
    assert spec.image_mean == spec.image_std == (0.5, 0.5, 0.5)
    assert isinstance(make_adapter(spec), Idefics3Adapter)


def test_pack_pixels_equal_the_processors(tiny):
    _, _, spec, refs = tiny
    adapter = make_adapter(spec)
    host = adapter(reference_pack(refs, spec.image_policy(), spec.image_token_id))
    take_meta(host)
    inputs = adapter.finalize(host)
    want = torch.cat([r.processor_out["pixel_values"] for r in refs if "pixel_values" in r.processor_out], dim=1)
    assert inputs["pixel_values"].shape == want.shape and want.shape[0] == 1 and want.shape[2:] == (3, 32, 32)
    assert float((inputs["pixel_values"] - want).abs().max()) <= 1e-5
    assert inputs["pixel_attention_mask"].shape == (1, want.shape[1], 32, 32) and inputs["pixel_attention_mask"].all()
    assert inputs["position_ids"].shape == inputs["input_ids"].shape


@pytest.mark.parametrize("attn", ["sdpa", "vlmdata_varlen"])
def test_packed_equals_sum_of_samples(tiny, attn):
    _, folder, spec, refs = tiny
    model = tiny_model(folder, attn=attn)
    count = label_count(refs)
    inputs = packed_inputs(spec, refs, attn)
    packed_loss, packed_grads = run_packed(model, inputs, count)
    alone_loss, alone_grads = run_one_by_one(model, refs, count)
    assert abs(packed_loss - alone_loss) <= TOL * max(1.0, abs(alone_loss))
    assert_grads_close(packed_grads, alone_grads, rel=TOL)
    assert any(n.startswith("model.vision_model") for n in packed_grads)    # images trained
    cu = inputs["cu_seq_lens_q"].clone()
    cu[1] += int(cu[2] - cu[1]) // 2                                         # sample 0 swallows half of sample 1
    shifted = dict(inputs, **flash_kwargs(cu, int((cu[1:] - cu[:-1]).max())))
    if attn == "sdpa":
        shifted["attention_mask"] = block_causal_mask(cu, shifted["input_ids"].shape[1])
    wrong_loss, _ = run_packed(model, shifted, count)
    assert abs(wrong_loss - alone_loss) > TOL * max(1.0, abs(alone_loss))  # the check can fail


def test_vlm_trainer_trains_it(tiny, tmp_path):
    from transformers import TrainingArguments

    from tests.helpers.models import shard_reference_rows
    from vlmdata import VLMDataset
    from vlmdata.hf import VLMTrainer

    family, folder, spec, _ = tiny
    _, _, data = shard_reference_rows(tmp_path, folder)
    ds = VLMDataset(str(data), max_tokens=1024, rank=0, world_size=1)
    assert ds.model_family.name == family
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=1,
                             learning_rate=1e-3, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                             report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = VLMTrainer(model=tiny_model(folder).train(), args=args, train_dataset=ds, spec=spec)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert trainer.state.global_step == 4 and len(losses) == 4 and all(math.isfinite(x) for x in losses)


def test_bucket_rows_take_the_same_tiles(tiny):
    """Bucket-mode packs ([B, L] rows, 2-D mask): the tiles of every row in one [1, N, ...] block (the model
    flattens batch and image axes) give the loss of the samples run alone."""
    _, folder, spec, refs = tiny
    adapter = make_adapter(spec, "sdpa")
    host = adapter(reference_pack(refs, spec.image_policy(), spec.image_token_id, mode="bucket"))
    take_meta(host)
    inputs = adapter.finalize(host)
    assert inputs["input_ids"].shape[0] == len(refs) and inputs["pixel_values"].shape[0] == 1
    model = tiny_model(folder)
    count = label_count(refs)
    rows_loss, rows_grads = run_packed(model, inputs, count)
    alone_loss, alone_grads = run_one_by_one(model, refs, count)
    assert abs(rows_loss - alone_loss) <= TOL * max(1.0, abs(alone_loss))
    assert_grads_close(rows_grads, alone_grads, rel=TOL)
