"""Output adapters: what reaches forward for each family, in pack and bucket mode, and in DataLoader workers."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.dataset import make_samples, write_dataset
from tests.helpers.hf import (
    llava_processor,
    make_conversations,
    qwen_processor,
    reference_pack,
    references,
    write_llava_folder,
    write_qwen_folder,
)
from vlmdata.errors import AdapterError
from vlmdata.hf import META_KEY, LlavaAdapter, ModelSpec, QwenVLAdapter, make_adapter, take_meta
from vlmdata.loading import VLMDataset, make_loader


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    proc = qwen_processor()
    spec = ModelSpec.from_folder(write_qwen_folder(str(tmp_path_factory.mktemp("qwen")), proc))
    refs = references(make_conversations(6, seed=11), proc, "qwen2-vl", spec.image_policy())
    return spec, refs


def _only_tensors_and_ints(inputs: dict) -> None:
    for k, v in inputs.items():
        assert isinstance(v, (torch.Tensor, int)), k
        assert not isinstance(v, (str, list, dict)), k


def test_qwen_pack_inputs(qwen):
    spec, refs = qwen
    pack = reference_pack(refs, spec.image_policy(), spec.image_token_id)
    pack["state"] = {"epoch": 0, "cursor": 1}
    pack["stats"] = {"samples": len(refs)}
    adapter = make_adapter(spec, "sdpa")
    assert isinstance(adapter, QwenVLAdapter)
    host = adapter(pack)
    total = len(pack["input_ids"])
    assert host["input_ids"].shape == host["labels"].shape == (1, total)
    assert host["position_ids"].shape == (3, 1, total)
    assert host["pixel_values"].dtype == torch.uint8                       # normalised later, on the device
    assert host["cu_seq_lens_q"].tolist() == pack["cu_seqlens"].tolist()
    assert host["max_length_q"] == host["max_length_k"] == pack["max_seqlen"]
    meta = take_meta(host)
    assert meta["sample_keys"] == [r.key for r in refs] and meta["state"]["cursor"] == 1
    assert META_KEY not in host
    inputs = adapter.finalize(host)
    _only_tensors_and_ints(inputs)
    assert inputs["attention_mask"].shape == (1, 1, total, total)           # sdpa ignores cu_seq_lens: a block mask
    assert inputs["pixel_values"].dtype == torch.float32
    assert set(inputs) == {"input_ids", "labels", "position_ids", "pixel_values", "image_grid_thw", "cu_seq_lens_q",
                           "cu_seq_lens_k", "max_length_q", "max_length_k", "attention_mask"}
    varlen = make_adapter(spec, "flash_attention_2").finalize(make_adapter(spec, "flash_attention_2")(pack))
    assert "attention_mask" not in varlen                                 # flash reads the boundaries itself


def test_finalize_drops_meta_and_rejects_strays(qwen):
    spec, refs = qwen
    adapter = make_adapter(spec, "eager")
    host = adapter(reference_pack(refs[:2], spec.image_policy(), spec.image_token_id))
    inputs = adapter.finalize(host, dtype=torch.float64)
    assert META_KEY not in inputs and inputs["attention_mask"].dtype == torch.float64   # eager: additive mask
    host["note"] = "a string"
    with pytest.raises(AdapterError, match="'note' is a str"):
        adapter.finalize(host)


def test_bucket_mode_rows(qwen):
    spec, refs = qwen
    adapter = make_adapter(spec, "sdpa")
    packed = adapter(reference_pack(refs, spec.image_policy(), spec.image_token_id))
    bucket = reference_pack(refs, spec.image_policy(), spec.image_token_id, mode="bucket")
    rows = adapter(bucket)
    assert rows["input_ids"].shape == bucket["input_ids"].shape and "cu_seq_lens_q" not in rows
    assert rows["position_ids"].shape == (3, *bucket["input_ids"].shape)
    mask = bucket["attention_mask"].bool()
    assert torch.equal(rows["position_ids"][:, mask], packed["position_ids"][:, 0])   # same positions per sample
    assert "attention_mask" in adapter.finalize(rows) and adapter.finalize(rows)["attention_mask"].dim() == 2


def test_packs_without_images_and_empty_packs(qwen):
    spec, refs = qwen
    text_only = [r for r in refs if not r.decoded][:1] or pytest.skip("corpus has no text-only sample")
    adapter = make_adapter(spec)
    inputs = adapter.finalize(adapter(reference_pack(text_only, spec.image_policy(), spec.image_token_id)))
    assert "pixel_values" not in inputs and "image_grid_thw" not in inputs
    empty = reference_pack([], spec.image_policy(), spec.image_token_id)
    inputs = adapter.finalize(adapter(empty))
    assert inputs["input_ids"].shape == (1, 1) and inputs["labels"].tolist() == [[-100]]


def test_bad_packs(qwen):
    spec, refs = qwen
    adapter = make_adapter(spec)
    with pytest.raises(AdapterError, match="defer_decode"):
        adapter({"input_ids": torch.zeros(2), "image_bytes": [b""]})
    with pytest.raises(AdapterError, match="encoded clips"):
        adapter({"input_ids": torch.zeros(2), "video_bytes": [b""]})
    with pytest.raises(AdapterError, match="not a PackedBatch"):
        adapter({"input_ids": torch.zeros(2)})
    pack = reference_pack(refs, spec.image_policy(), spec.image_token_id)
    pack.pop("image_grid")
    with pytest.raises(AdapterError, match="without image_grid"):
        adapter(pack)
    with pytest.raises(AdapterError, match="serves llava"):
        LlavaAdapter(spec)


def test_llava_pack_inputs(tmp_path):
    proc = llava_processor()
    spec = ModelSpec.from_folder(write_llava_folder(str(tmp_path), proc))
    refs = references(make_conversations(3, seed=2, max_images=1), proc, "llava", spec.image_policy())
    pack = reference_pack(refs, spec.image_policy(), spec.image_token_id)
    adapter = make_adapter(spec, "sdpa")
    assert isinstance(adapter, LlavaAdapter)
    inputs = adapter.finalize(adapter(pack))
    total = len(pack["input_ids"])
    assert inputs["position_ids"].shape == (1, total)
    assert torch.equal(inputs["position_ids"][0], pack["position_ids"])
    assert inputs["pixel_values"].shape[1:] == (3, 336, 336)
    _only_tensors_and_ints(inputs)
    flat = dict(pack, pixel_values=torch.zeros(8, 588, dtype=torch.uint8))
    with pytest.raises(AdapterError, match="dynamic policy"):
        adapter(flat)
    small = dict(pack, pixel_values=torch.zeros(1, 3, 224, 224, dtype=torch.uint8))
    with pytest.raises(AdapterError, match="takes 336x336"):
        adapter(small)


def test_make_loader_runs_the_adapter_in_workers(tmp_path):
    write_dataset(str(tmp_path / "ds"), make_samples(24, seed=4, max_images=2))
    folder = write_qwen_folder(str(tmp_path / "qwen"), vocab_size=262, image_token_id=258)
    spec = ModelSpec.from_folder(folder)
    ds = VLMDataset(str(tmp_path / "ds"), max_tokens=512, image_size=spec.image_policy(), decoder="pillow")
    adapter = make_adapter(spec, "vlmdata_varlen")
    seen, packs = [], 0
    for batch in make_loader(ds, num_workers=1, adapter=adapter):
        assert batch["position_ids"].shape[0] == 3 and batch["pixel_values"].dtype == torch.uint8
        seen += take_meta(batch)["sample_keys"]
        _only_tensors_and_ints(adapter.finalize(batch))
        packs += 1
    assert sorted(seen) == [f"s{i:05d}" for i in range(24)]                # every sample once, keys kept aside
    assert packs == ds.num_steps()
