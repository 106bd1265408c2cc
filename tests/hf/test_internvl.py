"""InternVL3 through the output adapter (issue 21): with the real transformers classes (InternVLProcessor with
GotOcr2ImageProcessorPil, a tiny randomly initialised InternVLForConditionalGeneration, fp32 on CPU), a pack's
tiles equal the processor's pixel_values (from the original files, 1e-5), its loss and gradients equal the sum
over its samples run alone (1e-5) and a moved boundary breaks that; a corpus sharded with the model folder
trains through VLMTrainer, the reference loop (`--model hf:DIR`) and a 2-process `accelerate launch`."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.hf import (
    accelerate_launch,
    check_packed_equals_alone,
    internvl_processor,
    make_conversations,
    reference_pack,
    references,
    tiny_model,
    write_internvl_folder,
)
from tests.helpers.models import shard_reference_rows
from vlmdata import VLMDataset
from vlmdata.errors import AdapterError
from vlmdata.hf import InternVLAdapter, ModelSpec, VLMTrainer, make_adapter, take_meta


@pytest.fixture(scope="module")
def internvl(tmp_path_factory):
    folder = write_internvl_folder(str(tmp_path_factory.mktemp("internvl")))
    spec = ModelSpec.from_folder(folder)
    refs = references(make_conversations(6, seed=41, max_images=2), internvl_processor(), "internvl",
                      spec.image_policy(), exact=True)
    tiles = [len(t) for r in refs for t in r.decoded]
    assert len(tiles) >= 4 and max(tiles) > 1                # several images, tiled ones (grid + thumbnail)
    return folder, spec, refs


def test_spec_and_adapter_are_internvls(internvl):
    folder, spec, _ = internvl
    assert spec.family == "internvl" and isinstance(make_adapter(spec), InternVLAdapter)
    assert spec.image_mean == (0.485, 0.456, 0.406) and spec.image_std == (0.229, 0.224, 0.225)
    assert spec.policy["tile"] == 56 and spec.policy["per_tile"] == 4 and spec.policy["max_tiles"] == 4


def test_pack_pixels_equal_the_processors_tiles(internvl):
    _, spec, refs = internvl
    adapter = make_adapter(spec)
    host = adapter(reference_pack(refs, spec.image_policy(), spec.image_token_id))
    take_meta(host)
    inputs = adapter.finalize(host)
    want = torch.cat([r.processor_out["pixel_values"] for r in refs if "pixel_values" in r.processor_out])
    assert inputs["pixel_values"].shape == want.shape and want.shape[1:] == (3, 56, 56)
    assert float((inputs["pixel_values"] - want).abs().max()) <= 1e-5
    assert set(inputs) == {"input_ids", "labels", "position_ids", "pixel_values", "attention_mask", "cu_seq_lens_q",
                           "cu_seq_lens_k", "max_length_q", "max_length_k"}
    ids = inputs["input_ids"][0]
    assert int((ids == spec.image_token_id).sum()) == 4 * want.shape[0]     # 4 tokens per tile, every tile


@pytest.mark.parametrize("attn", ["sdpa", "vlmdata_varlen"])
def test_packed_equals_sum_of_samples(internvl, attn):
    folder, spec, refs = internvl
    check_packed_equals_alone(folder, spec, refs, attn)


def test_tiles_of_another_size_are_refused(internvl):
    _, spec, refs = internvl
    other = ModelSpec.from_dict({**spec.to_dict(), "policy": {**spec.policy, "tile": 112}})
    with pytest.raises(AdapterError, match="tiles are 56x56 but internvl takes 112x112"):
        make_adapter(other)(reference_pack(refs, spec.image_policy(), spec.image_token_id))


@pytest.fixture(scope="module")
def sharded(internvl, tmp_path_factory):
    """The hostile reference corpus sharded with the tiny model's folder: (dataset root, samples)."""
    tmp = tmp_path_factory.mktemp("internvl-data")
    _, expected, data = shard_reference_rows(tmp, internvl[0], max_samples_per_shard=4)
    return str(data), len(expected)


def test_a_corpus_sharded_with_the_folder_trains_through_vlmtrainer(internvl, sharded, tmp_path):
    from transformers import TrainingArguments

    folder, spec, _ = internvl
    root, n = sharded
    ds = VLMDataset(root, max_tokens=1024, max_images=64, rank=0, world_size=1)
    assert ds.model_family.name == "internvl" and ds.pixels == "exact"
    assert {**ModelSpec.from_dataset(ds).to_dict(), "vocab_size": None} == {**spec.to_dict(), "vocab_size": None}
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=1,
                             learning_rate=2e-3, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                             report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    keys = []
    trainer = VLMTrainer(model=tiny_model(folder, attn="sdpa").train(), args=args, train_dataset=ds, spec=spec,
                         on_pack=lambda m: keys.extend(m["sample_keys"]))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert trainer.state.global_step == len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))
    assert {k.split("/")[-1] for k in keys} >= {f"conv{i}" for i in range(n)}               # every sample trained


def test_the_reference_loop_trains_it_with_model_hf_dir(internvl, sharded, tmp_path):
    import json

    from vlmdata_pipelines.train import main

    folder, _, _ = internvl
    out = tmp_path / "out"
    assert main(["--data", sharded[0], "--model", f"hf:{folder}", "--steps", "6", "--max-tokens", "1024",
                 "--num-workers", "0", "--lr", "3e-3", "--out", str(out)]) == 0
    result = json.load(open(out / "result.rank0.json"))
    assert result["steps"] == list(range(6)) and result["images"] > 0
    assert all(torch.isfinite(torch.tensor(result["losses"])))


@pytest.mark.integration
@pytest.mark.slow
def test_accelerate_launch_two_processes(internvl, sharded, tmp_path):
    import json

    folder, _, _ = internvl
    out = tmp_path / "run"
    accelerate_launch(["-m", "vlmdata_pipelines.hf_trainer", "--data", sharded[0], "--model", folder, "--out",
                       str(out), "--epochs", "1", "--max-tokens", "1024", "--num-workers", "1"])
    results = [json.load(open(out / f"result.rank{r}.json")) for r in range(2)]
    keys = [r["keys_by_epoch"]["0"] for r in results]
    assert all(keys) and not set(keys[0]) & set(keys[1])                   # both ranks trained, no sample twice
    assert len(keys[0]) + len(keys[1]) == sharded[1]
    assert all(torch.isfinite(torch.tensor(results[0]["losses"])))
