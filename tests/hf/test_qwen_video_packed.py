"""Videos through tiny random Qwen2-VL and Qwen2.5-VL models (issue 22 items 5-6): a pack loaded from a
LLaVA-Video JSON sharded with a Qwen2-VL folder (clips made at test time, images, text-only samples) gives,
through the output adapter, the same loss and gradients (fp32, 1e-5) as each sample run alone with the model
computing its own positions (its `get_rope_index` over `mm_token_type_ids`, image 1 / video 2); a moved
boundary fails that check; and the adapter's M-RoPE positions equal the model's rope index per sample
(Qwen2-VL: the temporal patch index; Qwen2.5-VL: t * second_per_grid_t * tokens_per_second)."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.hf import _grads, qwen_config, tiny_model, write_qwen2_5_folder
from tests.helpers.models import qwen_folder_or_skip
from tests.helpers.train import assert_grads_close
from tests.video.qwen_video_corpus import qwen_video_folder, shard_corpus
from vlmdata import VLMDataset
from vlmdata.hf import ModelSpec, block_causal_mask, flash_kwargs, make_adapter, take_meta

TOL = 1e-5
IDS = [151655, 151652, 151653, 151656]        # image, vision start, vision end, video (the Qwen2 tokenizer's)
VOCAB = 151936


def _write_qwen2(path: str) -> str:
    import json
    import os

    os.makedirs(path, exist_ok=True)
    qwen_config(VOCAB, *IDS).save_pretrained(path)
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump({"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, "merge_size": 2,
                   "temporal_patch_size": 2, "min_pixels": 56 * 56, "max_pixels": 12845056}, f)
    return path


WRITERS = {"qwen2-vl": _write_qwen2, "qwen2.5-vl": lambda p: write_qwen2_5_folder(p, ids=IDS, vocab_size=VOCAB)}


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("qvideo-hf")
    folder = qwen_video_folder(qwen_folder_or_skip(), str(root / "qwen2-vl"))
    ds = shard_corpus(str(root), folder)
    batches = list(VLMDataset(ds, max_tokens=8192))
    assert len(batches) == 1 and len(batches[0]["sample_keys"]) == 6
    b = batches[0]
    assert b["video_grid"].shape[0] == 5 and b["image_grid"].shape[0] == 2
    b["_root"] = ds            # where it was loaded from (read by the bucket test; dropped before the adapter)
    return b


@pytest.fixture(scope="module", params=sorted(WRITERS))
def model_and_spec(request, tmp_path_factory):
    folder = WRITERS[request.param](str(tmp_path_factory.mktemp(request.param)))
    spec = ModelSpec.from_folder(folder)
    assert spec.family == request.param and spec.video_token_id == IDS[3]
    return tiny_model(folder), spec


def _inputs(spec, pack: dict) -> dict:
    adapter = make_adapter(spec, "sdpa")
    host = adapter({k: v for k, v in pack.items() if k != "_root"})
    take_meta(host)
    return adapter.finalize(host)


def _samples(spec, inputs: dict) -> list[dict]:
    """Each packed sample alone: its slices of ids, labels and pixels, with mm_token_type_ids and no positions
    (the model computes its own)."""
    cu = inputs["cu_seq_lens_q"].tolist()
    ids, labels = inputs["input_ids"][0], inputs["labels"][0]
    out, im, vid, im_row, vid_row = [], 0, 0, 0, 0
    for a, b in zip(cu[:-1], cu[1:]):
        s_ids = ids[a:b]
        types = (s_ids == spec.image_token_id).long() + 2 * (s_ids == spec.video_token_id).long()
        one = {"input_ids": s_ids[None], "labels": labels[a:b][None], "mm_token_type_ids": types[None]}
        for kind, grid_key, rows_key, tok in (("image", "image_grid_thw", "pixel_values", 1),
                                              ("video", "video_grid_thw", "pixel_values_videos", 2)):
            n = _runs(types == tok)
            if not n:
                continue
            first = im if kind == "image" else vid
            grid = inputs[grid_key][first:first + n]
            rows = int(grid.prod(dim=1).sum())
            at = im_row if kind == "image" else vid_row
            one[grid_key], one[rows_key] = grid, inputs[rows_key][at:at + rows]
            if kind == "image":
                im, im_row = im + n, im_row + rows
            else:
                if "second_per_grid_ts" in inputs:
                    one["second_per_grid_ts"] = inputs["second_per_grid_ts"][first:first + n]
                vid, vid_row = vid + n, vid_row + rows
        out.append(one)
    return out


def _runs(mask: torch.Tensor) -> int:
    m = torch.cat([torch.zeros(1, dtype=torch.long), mask.long()])
    return int(((m[1:] - m[:-1]) == 1).sum())


def _count(inputs: dict) -> int:
    return int((inputs["labels"][0, 1:] != -100).sum())


def test_video_fields_reach_the_model_in_its_layout(model_and_spec, pack):
    _, spec = model_and_spec
    inputs = _inputs(spec, pack)
    assert inputs["pixel_values_videos"].dtype == torch.float32
    assert inputs["pixel_values_videos"].shape == (int(inputs["video_grid_thw"].prod(dim=1).sum()), 3 * 2 * 14 * 14)
    assert ("second_per_grid_ts" in inputs) == (spec.family == "qwen2.5-vl")
    mean = torch.tensor(spec.image_mean).view(1, 3, 1)
    std = torch.tensor(spec.image_std).view(1, 3, 1)
    raw = pack["pixel_values_videos"].view(len(pack["pixel_values_videos"]), 3, -1).float()
    want = ((raw / 255 - mean) / std).reshape(inputs["pixel_values_videos"].shape)
    assert float((inputs["pixel_values_videos"] - want).abs().max()) <= 1e-5


def test_positions_equal_the_models_rope_index_per_sample(model_and_spec, pack):
    model, spec = model_and_spec
    inputs = _inputs(spec, pack)
    cu = inputs["cu_seq_lens_q"].tolist()
    videos_seen = 0
    for (a, b), one in zip(zip(cu[:-1], cu[1:]), _samples(spec, inputs)):
        kw = {k: one[k] for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts") if k in one}
        want, _ = model.model.get_rope_index(one["input_ids"], one["mm_token_type_ids"], **kw)
        assert torch.equal(inputs["position_ids"][:, 0, a:b], want[:, 0])
        videos_seen += len(one.get("video_grid_thw", []))
    assert videos_seen == 5


def test_packed_equals_sum_of_samples_and_a_moved_boundary_fails(model_and_spec, pack):
    model, spec = model_and_spec
    inputs = _inputs(spec, pack)
    count = _count(inputs)
    model.zero_grad(set_to_none=True)
    loss = model(**inputs, num_items_in_batch=count).loss
    loss.backward()
    packed_loss, packed_grads = float(loss.detach()), _grads(model)
    model.zero_grad(set_to_none=True)
    alone_loss = 0.0
    for one in _samples(spec, inputs):
        out = model(**one, num_items_in_batch=count)
        out.loss.backward()
        alone_loss += float(out.loss.detach())
    alone_grads = _grads(model)
    assert abs(packed_loss - alone_loss) <= TOL * max(1.0, abs(alone_loss))
    assert_grads_close(packed_grads, alone_grads, rel=TOL)
    assert any(n.startswith("model.visual") for n in packed_grads)          # the vision tower trained
    cu = inputs["cu_seq_lens_q"].clone()
    cu[1] += int(cu[2] - cu[1]) // 2                                         # sample 0 swallows half of sample 1
    shifted = dict(inputs, **flash_kwargs(cu, int((cu[1:] - cu[:-1]).max())))
    shifted["attention_mask"] = block_causal_mask(cu, inputs["input_ids"].shape[1])
    with torch.no_grad():
        wrong = float(model(**shifted, num_items_in_batch=count).loss)
    assert abs(wrong - alone_loss) > TOL * max(1.0, abs(alone_loss))


def test_bucket_rows_get_the_positions_of_their_packed_samples(model_and_spec, pack):
    """Bucket mode (rows padded to the longest): each row's M-RoPE positions are its packed sample's."""
    from vlmdata.loading import DatasetOptions

    _, spec = model_and_spec
    inputs = _inputs(spec, pack)
    cu = inputs["cu_seq_lens_q"].tolist()
    packed = {k: inputs["position_ids"][:, 0, a:b] for k, a, b in zip(pack["sample_keys"], cu[:-1], cu[1:])}
    root = pack["_root"]
    rows = 0
    adapter = make_adapter(spec, "sdpa")
    for b in VLMDataset(root, max_tokens=8192, options=DatasetOptions(mode="bucket")):
        host = adapter(b)
        for i, key in enumerate(b["sample_keys"]):
            n = int(b["lengths"][i])
            assert torch.equal(host["position_ids"][:, i, :n], packed[key]), key
            rows += 1
    assert rows == 6
