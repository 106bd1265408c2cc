"""Gemma 3 through the output adapter (issue 21), with transformers' own classes: a tiny randomly initialised
Gemma3ForConditionalGeneration (1-layer SigLIP at 224 px, 16 soft tokens per image; a sliding-window layer of
24 tokens and a full-attention layer, fp32 on CPU). The pack's masks equal the model's own per sample
(bidirectional inside each image, sliding window, nothing across samples); a pack of the hostile corpus,
sharded and loaded, gives the loss and gradients of its samples run alone through the processor's inputs
(1e-5), and a moved boundary, a plain block-causal mask or a mask without the sliding window do not;
VLMTrainer trains it. With pan-and-scan (a do_pan_and_scan folder), a pack of images with crops equals its
samples through Gemma3Processor(do_pan_and_scan=True)."""
from __future__ import annotations

import io
import math

import pytest
import torch

from tests.helpers.gemma3 import shard_corpus
from tests.helpers.hf import Reference, run_one_by_one, run_packed, tiny_model
from tests.helpers.models import gemma3_processor
from tests.helpers.train import assert_grads_close
from vlmdata.errors import AdapterError
from vlmdata.hf import (
    Gemma3Adapter,
    HFBatchAdapter,
    ModelSpec,
    VLMTrainer,
    block_causal_mask,
    gemma3_packed_masks,
    make_adapter,
    take_meta,
    text_attention,
)
from vlmdata.loading import VLMDataset
from vlmdata.testing import gemma3_folder

TOL = 1e-5
WINDOW = 24
SIZES = [(640, 480), (3, 2), (500, 40), (40, 300), (224, 224), (97, 211)]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3-hf")
    folder = gemma3_folder(root / "model", image_size=224, tokens_per_image=16, tiny=True, sliding_window=WINDOW)
    rows, expected, data = shard_corpus(folder, root, sizes=SIZES)
    ds = VLMDataset(str(data), max_tokens=1 << 16, max_images=64, rank=0, world_size=1)
    pack = next(iter(ds))
    assert len(pack["sample_keys"]) == len(expected) and pack["pixel_values"].shape[0] >= 15
    return folder, ModelSpec.from_folder(str(folder)), pack, rows, expected


def _model(folder, attn: str):
    model = tiny_model(str(folder), attn=attn)
    with torch.no_grad():   # Gemma 3 initialises its projector to zeros: no gradient would reach the vision tower
        torch.manual_seed(1)
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(std=0.5)
    return model


def _samples(pack) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(key, ids, labels) of each sample of a pack, or of each row of a bucket batch (its real tokens)."""
    if "cu_seqlens" in pack:
        cu = pack["cu_seqlens"].tolist()
        return [(k, pack["input_ids"][a:b], pack["labels"][a:b]) for k, a, b in zip(pack["sample_keys"], cu, cu[1:])]
    return [(k, pack["input_ids"][i, :n], pack["labels"][i, :n])
            for i, (k, n) in enumerate(zip(pack["sample_keys"], pack["lengths"].tolist()))]


def _alone(pack, rows, expected, processor, **settings) -> list[Reference]:
    """Each sample of the pack as the processor gives it (original files opened as load_image does; `settings`:
    the processor's call arguments), with the pack's labels (its ids are asserted equal to the processor's)."""
    from PIL import Image
    from transformers.image_utils import load_image

    out = []
    for key, ids, labels in _samples(pack):
        messages, images = expected[int(key.split("conv")[-1])]
        files = [load_image(Image.open(io.BytesIO(im_bytes))) for im_bytes in _files(rows, key)]
        assert len(files) == len(images)
        text = processor.apply_chat_template(messages, tokenize=False)
        ref = processor(text=[text], images=[files] if files else None, add_special_tokens=False, return_tensors="pt",
                        **settings)
        assert torch.equal(ids, ref["input_ids"][0]), key
        out.append(Reference(key, dict(ref), ids.numpy(), labels.numpy(), [], []))
    return out


def _files(rows, key: str) -> list[bytes]:
    import json

    for line in rows.read_text().splitlines():
        row = json.loads(line)
        if key.endswith(row["id"]):
            return [(rows.parent / f).read_bytes() for f in row["images"]]
    raise KeyError(key)


def _inputs(spec, pack, attn: str) -> dict:
    adapter = make_adapter(spec, attn)
    host = adapter(dict(pack))
    take_meta(host)
    return adapter.finalize(host)


def test_pack_masks_equal_the_models_own_masks_per_sample(gemma):
    from transformers.models.gemma3.modeling_gemma3 import (
        create_masks_for_vision_model,
        get_block_sequence_ids_for_mask,
    )

    folder, spec, pack, _, _ = gemma
    model = _model(folder, "sdpa")
    inputs = _inputs(spec, pack, "sdpa")
    masks, types = inputs["attention_mask"], inputs["token_type_ids"]
    assert set(masks) == {"full_attention", "sliding_attention"}
    cu = pack["cu_seqlens"].tolist()
    text = model.config.get_text_config()
    for a, b in zip(cu[:-1], cu[1:]):
        t = types[:, a:b]
        want = create_masks_for_vision_model(text, torch.zeros(1, b - a, 8), None, None, torch.arange(b - a)[None],
                                             get_block_sequence_ids_for_mask(t))
        for kind, mask in masks.items():
            assert torch.equal(mask[..., a:b, a:b], want[kind].expand(1, 1, b - a, b - a)), kind
            assert not mask[..., a:b, :a].any() and not mask[..., a:b, b:].any()      # nothing across samples
    assert (types == 1).sum() == 16 * pack["pixel_values"].shape[0] and max(
        y - x for x, y in zip(cu[:-1], cu[1:])) > 2 * WINDOW                        # the window cuts in


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_equals_sum_of_samples(gemma, attn):
    folder, spec, pack, rows, expected = gemma
    _check_packed_equals_alone(folder, spec, pack, _alone(pack, rows, expected, gemma3_processor(folder)), attn)


@pytest.mark.slow
def test_pan_and_scan_packed_equals_sum_of_samples(tmp_path):
    """A do_pan_and_scan folder: the pack (images of 0, 2 and 4 crops) against each sample alone through
    Gemma3Processor(do_pan_and_scan=True)."""
    folder = gemma3_folder(tmp_path / "model", image_size=224, tokens_per_image=16, tiny=True,
                           sliding_window=WINDOW, do_pan_and_scan=True)
    sizes = [(640, 480), (3, 2), (1100, 300), (300, 700), (224, 224), (97, 211)]
    rows, expected, data = shard_corpus(folder, tmp_path, sizes=sizes)
    pack = next(iter(VLMDataset(str(data), max_tokens=1 << 16, max_images=64, rank=0, world_size=1)))
    images = sum(len(im) for _, im in expected)
    assert len(pack["sample_keys"]) == len(expected) and pack["pixel_values"].shape[0] >= images + 10
    refs = _alone(pack, rows, expected, gemma3_processor(folder), do_pan_and_scan=True)
    _check_packed_equals_alone(folder, ModelSpec.from_folder(str(folder)), pack, refs, "sdpa")


def _check_packed_equals_alone(folder, spec, pack, refs, attn: str) -> None:
    """The pack's loss and gradients equal its samples' alone (`refs`); a moved boundary, a plain block-causal
    mask or a mask without the sliding window do not."""
    model = _model(folder, attn)
    count = int((pack["labels"] != -100).sum())
    inputs = _inputs(spec, pack, attn)
    packed_loss, packed_grads = run_packed(model, inputs, count)
    alone_loss, alone_grads = run_one_by_one(model, refs, count)
    assert math.isfinite(alone_loss) and abs(packed_loss - alone_loss) <= TOL * max(1.0, abs(alone_loss))
    assert_grads_close(packed_grads, alone_grads, rel=TOL)
    assert any(n.startswith("model.vision_tower") and float(g.abs().max()) > 0 for n, g in packed_grads.items())
    additive = torch.float32 if attn == "eager" else None
    cu = inputs["cu_seq_lens_q"].clone()
    cu[1] += int(cu[2] - cu[1]) // 2                                          # sample 0 swallows half of sample 1
    types, total = inputs["token_type_ids"], inputs["input_ids"].shape[1]
    plain = block_causal_mask(inputs["cu_seq_lens_q"], total, additive)
    no_window = gemma3_packed_masks(inputs["cu_seq_lens_q"], types, total + 1, additive)
    for wrong in (gemma3_packed_masks(cu, types, WINDOW, additive),          # a moved boundary
                  {"full_attention": plain, "sliding_attention": plain},      # no bidirectional image attention
                  {**no_window, "full_attention": inputs["attention_mask"]["full_attention"]}):  # no window
        loss, _ = run_packed(model, {**inputs, "attention_mask": wrong}, count)
        assert abs(loss - alone_loss) > TOL * max(1.0, abs(alone_loss))     # the check can fail


def test_bucket_rows_equal_their_samples_alone(gemma, tmp_path):
    """Bucket mode: padded rows with the 2-D mask; the model builds its own masks from it and token_type_ids."""
    from vlmdata import DatasetOptions

    folder, spec, _, rows, expected = gemma
    data = rows.parent.parent / "ds"
    ds = VLMDataset(str(data), max_tokens=2048, max_images=64, rank=0, world_size=1,
                    options=DatasetOptions(mode="bucket"))
    batch = next(b for b in ds if b["input_ids"].shape[0] >= 2 and "pixel_values" in b)
    adapter = make_adapter(spec)
    host = adapter(batch)
    take_meta(host)
    inputs = adapter.finalize(host)
    assert inputs["attention_mask"].dim() == 2 and inputs["token_type_ids"].shape == inputs["input_ids"].shape
    model = _model(folder, "sdpa")
    count = int((batch["labels"] != -100).sum())
    rows_loss, rows_grads = run_packed(model, inputs, count)
    alone_loss, alone_grads = run_one_by_one(model, _alone(batch, rows, expected, gemma3_processor(folder)), count)
    assert abs(rows_loss - alone_loss) <= TOL * max(1.0, abs(alone_loss))
    assert_grads_close(rows_grads, alone_grads, rel=TOL)


def test_adapter_keys_and_refusals(gemma):
    folder, spec, pack, _, _ = gemma
    assert isinstance(make_adapter(spec), Gemma3Adapter) and spec.sliding_window == WINDOW
    inputs = _inputs(spec, pack, "sdpa")
    assert inputs["pixel_values"].shape[1:] == (3, 224, 224) and inputs["pixel_values"].dtype == torch.float32
    assert torch.equal(inputs["token_type_ids"], (inputs["input_ids"] == spec.image_token_id).long())
    for attn in ("flash_attention_2", "vlmdata_varlen"):
        with pytest.raises(AdapterError, match="bidirectionally inside each image"):
            make_adapter(spec, attn)
    from dataclasses import replace

    unknown = replace(spec, sliding_window=None)                              # a spec from a dataset's manifest
    with pytest.raises(AdapterError, match="sliding_window"):
        _inputs(unknown, pack, "sdpa")
    model = tiny_model(str(folder), attn="auto")
    assert text_attention(model) == "sdpa"                                    # auto: no varlen path for Gemma 3
    assert HFBatchAdapter.for_model(unknown, model).spec.sliding_window == WINDOW   # the model's config says


def test_vlm_trainer_trains_it(gemma, tmp_path):
    from transformers import TrainingArguments

    folder, spec, _, _, _ = gemma
    _, _, data = shard_corpus(folder, tmp_path, sizes=SIZES)
    model = _model(folder, "sdpa").train()
    seen = []
    forward = model.forward

    def spy(**kwargs):
        seen.append(sorted(kwargs))
        return forward(**kwargs)

    model.forward = spy
    ds = VLMDataset(str(data), max_tokens=400, max_images=8, rank=0, world_size=1)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=1,
                             learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                             report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = VLMTrainer(model=model, args=args, train_dataset=ds, spec=spec)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 6 and all(math.isfinite(v) for v in losses)
    assert any({"pixel_values", "token_type_ids", "attention_mask"} <= set(k) for k in seen)
