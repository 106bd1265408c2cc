"""Checks of packs with videos through tiny random Qwen-VL models: the adapter's inputs, each packed sample cut out
to run alone (the model then computes its own positions from `mm_token_type_ids`: image 1, video 2), the rope
index per sample, and packed loss / gradients equal to the samples' alone (a moved boundary fails)."""
from __future__ import annotations

import torch

from tests.helpers.hf import _grads
from tests.helpers.train import assert_grads_close
from vlmdata.hf import block_causal_mask, flash_kwargs, make_adapter, take_meta

TOL = 1e-5


def adapter_inputs(spec, pack: dict) -> dict:
    """What the model takes for `pack` (keys starting with "_" are the test's own and dropped)."""
    adapter = make_adapter(spec, "sdpa")
    host = adapter({k: v for k, v in pack.items() if not k.startswith("_")})
    take_meta(host)
    return adapter.finalize(host)


def _take_items(grids: torch.Tensor, first: int, tokens: int, merge: int) -> int:
    """How many grids from `first` on hold `tokens` LLM tokens (t*h*w / merge² each)."""
    n = got = 0
    while got < tokens:
        got += int(grids[first + n].prod()) // (merge * merge)
        n += 1
    assert got == tokens, "a sample's vision tokens do not end at a grid boundary"
    return n


def samples_alone(spec, inputs: dict) -> list[dict]:
    """Each packed sample alone: its slices of ids, labels, grids and pixel rows, with mm_token_type_ids and no
    positions (the model computes its own)."""
    cu = inputs["cu_seq_lens_q"].tolist()
    ids, labels = inputs["input_ids"][0], inputs["labels"][0]
    at = {"image": [0, 0], "video": [0, 0]}                   # next grid, next pixel row
    out = []
    for a, b in zip(cu[:-1], cu[1:]):
        s_ids = ids[a:b]
        types = (s_ids == spec.image_token_id).long() + 2 * (s_ids == spec.video_token_id).long()
        one = {"input_ids": s_ids[None], "labels": labels[a:b][None], "mm_token_type_ids": types[None]}
        for kind, grid_key, rows_key, tok in (("image", "image_grid_thw", "pixel_values", 1),
                                              ("video", "video_grid_thw", "pixel_values_videos", 2)):
            tokens = int((types == tok).sum())
            if not tokens:
                continue
            first, row = at[kind]
            n = _take_items(inputs[grid_key], first, tokens, spec.merge_size)
            grid = inputs[grid_key][first:first + n]
            rows = int(grid.prod(dim=1).sum())
            one[grid_key], one[rows_key] = grid, inputs[rows_key][row:row + rows]
            if kind == "video" and "second_per_grid_ts" in inputs:
                one["second_per_grid_ts"] = inputs["second_per_grid_ts"][first:first + n]
            at[kind] = [first + n, row + rows]
        out.append(one)
    return out


def trained_count(inputs: dict) -> int:
    return int((inputs["labels"][0, 1:] != -100).sum())


def assert_positions_are_the_rope_index(model, spec, inputs: dict) -> int:
    """The adapter's positions of each packed sample equal the model's get_rope_index on it alone; returns the
    number of videos seen."""
    cu = inputs["cu_seq_lens_q"].tolist()
    videos_seen = 0
    for (a, b), one in zip(zip(cu[:-1], cu[1:]), samples_alone(spec, inputs)):
        kw = {k: one[k] for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts") if k in one}
        want, _ = model.model.get_rope_index(one["input_ids"], one["mm_token_type_ids"], **kw)
        assert torch.equal(inputs["position_ids"][:, 0, a:b], want[:, 0])
        videos_seen += len(one.get("video_grid_thw", []))
    return videos_seen


def assert_packed_equals_alone(model, spec, inputs: dict, alone=None, tower: str = "model.visual") -> None:
    """Packed loss and gradients = the sum over the samples run alone (fp32, TOL; `alone(spec, inputs)` cuts them
    out, default `samples_alone`); the vision tower (parameters under `tower`) trains; a boundary moved into
    sample 1 changes the loss."""
    count = trained_count(inputs)
    model.zero_grad(set_to_none=True)
    loss = model(**inputs, num_items_in_batch=count).loss
    loss.backward()
    packed_loss, packed_grads = float(loss.detach()), _grads(model)
    model.zero_grad(set_to_none=True)
    alone_loss = 0.0
    for one in (alone or samples_alone)(spec, inputs):
        out = model(**one, num_items_in_batch=count)
        out.loss.backward()
        alone_loss += float(out.loss.detach())
    alone_grads = _grads(model)
    assert abs(packed_loss - alone_loss) <= TOL * max(1.0, abs(alone_loss))
    assert_grads_close(packed_grads, alone_grads, rel=TOL)
    assert any(n.startswith(tower) for n in packed_grads)                  # the vision tower trained
    cu = inputs["cu_seq_lens_q"].clone()
    cu[1] += int(cu[2] - cu[1]) // 2                                         # sample 0 swallows half of sample 1
    shifted = dict(inputs, **flash_kwargs(cu, int((cu[1:] - cu[:-1]).max())))
    shifted["attention_mask"] = block_causal_mask(cu, inputs["input_ids"].shape[1])
    with torch.no_grad():
        wrong = float(model(**shifted, num_items_in_batch=count).loss)
    assert abs(wrong - alone_loss) > TOL * max(1.0, abs(alone_loss))


def assert_bucket_positions_are_packed(spec, pack: dict, root: str) -> int:
    """Bucket mode (rows padded to the longest) over the dataset at `root`: each row's M-RoPE positions are its
    sample's in `pack`; returns the rows seen."""
    from vlmdata import VLMDataset
    from vlmdata.loading import DatasetOptions

    inputs = adapter_inputs(spec, pack)
    cu = inputs["cu_seq_lens_q"].tolist()
    packed = {k: inputs["position_ids"][:, 0, a:b] for k, a, b in zip(pack["sample_keys"], cu[:-1], cu[1:])}
    rows = 0
    adapter = make_adapter(spec, "sdpa")
    for b in VLMDataset(root, max_tokens=8192, options=DatasetOptions(mode="bucket")):
        host = adapter(b)
        for i, key in enumerate(b["sample_keys"]):
            n = int(b["lengths"][i])
            assert torch.equal(host["position_ids"][:, i, :n], packed[key]), key
            rows += 1
    return rows


def assert_trainer_trains_tower(model, ds_path: str, out, samples: int, tower: str = "model.vision_tower") -> None:
    """VLMTrainer for 2 epochs on a sharded dataset: finite losses, the vision tower's weights change, and
    every one of the dataset's `samples` is trained once per epoch."""
    import numpy as np
    from transformers import TrainingArguments

    from vlmdata import VLMDataset
    from vlmdata.hf import ModelSpec, VLMTrainer

    ds = VLMDataset(ds_path, max_tokens=4096, rank=0, world_size=1)
    model = model.train()
    args = TrainingArguments(output_dir=str(out), num_train_epochs=2, per_device_train_batch_size=1,
                             learning_rate=1e-3, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                             report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = VLMTrainer(model=model, args=args, train_dataset=ds, spec=ModelSpec.from_dataset(ds))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith(tower)}
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(np.isfinite(losses))
    assert before and any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if n in before)
    assert trainer.loader_stats.samples == 2 * samples
