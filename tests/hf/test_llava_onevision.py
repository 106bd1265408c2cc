"""LLaVA-OneVision through the output adapter (issue 21), with the real transformers classes (LlavaOnevisionProcessor,
a tiny randomly initialised LlavaOnevisionForConditionalGeneration: SigLIP + Qwen2, fp32, CPU, 28 px tiles, pinpoints
up to 4 x 4 tiles so the anyres_max_9 shrink happens): the policy's token count is the MODEL's feature count for
lone and multi-image samples of many sizes; a pack's pixel_values, image_sizes and tiling flags equal the
processor's; its loss and gradients equal the sum over its samples run alone (1e-5) and a moved boundary fails that
check; VLMTrainer trains a sharded corpus."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.exact_pixels import tile_rows_diff
from tests.helpers.hf import (
    check_packed_equals_alone,
    make_conversations,
    onevision_processor,
    onevision_text,
    reference_pack,
    references,
    tiny_model,
    write_onevision_folder,
)
from vlmdata.errors import AdapterError
from vlmdata.hf import ModelSpec, make_adapter, take_meta

TOL = 1e-5


@pytest.fixture(scope="module")
def onevision(tmp_path_factory):
    proc = onevision_processor()
    folder = write_onevision_folder(str(tmp_path_factory.mktemp("onevision")), proc)
    spec = ModelSpec.from_folder(folder)
    refs = references(make_conversations(6, seed=48, max_images=3), proc, "llava-onevision", spec.image_policy(),
                      exact=True, text=lambda conv: onevision_text(proc, conv))
    counts = [len(r.decoded) for r in refs]
    assert 1 in counts and max(counts) > 1 and 0 in counts        # lone images, several, text only
    return folder, spec, refs


def test_policy_counts_equal_the_models_own_feature_counts(onevision):
    """The model's get_image_features on the policy's tiles of 300 sizes (1-3,000 px, extreme aspect ratios), alone
    and three per sample: each image's feature count (unpadded grid, newlines, the anyres_max shrink) is the policy's."""
    folder, spec, _ = onevision
    policy = spec.image_policy()
    model = tiny_model(folder)
    rng = np.random.default_rng(3)
    w = np.exp(rng.uniform(0, np.log(3000), 300)).astype(np.int64) + 1
    h = np.exp(rng.uniform(0, np.log(3000), 300)).astype(np.int64) + 1
    shrunk = 0
    for per_sample in (1, 3):
        counts = np.full(len(w), per_sample)
        tiles = [torch.from_numpy(np.array(policy.pixels(Image.new("RGB", (int(a), int(b))), 3, per_sample)))
                 for a, b in zip(w, h)]
        pixels = torch.nn.utils.rnn.pad_sequence(tiles, batch_first=True).permute(0, 1, 4, 2, 3).float()
        with torch.no_grad():
            out = model.model.get_image_features(pixel_values=pixels, image_sizes=torch.from_numpy(np.stack([h, w], 1)),
                                                 batch_num_images=torch.full((len(w) // per_sample,), per_sample))
        got = np.array([len(f) for f in out.pooler_output])
        assert np.array_equal(got, policy.tokens(w, h, counts))
        shrunk += int((policy.tiles(w, h, counts) > 10).sum())
    assert shrunk > 0                                              # grids past anyres_max_9 were compared


def test_pack_pixels_sizes_and_tiling_equal_the_processors(onevision):
    _, spec, refs = onevision
    adapter = make_adapter(spec)
    host = adapter(reference_pack(refs, spec.image_policy(), spec.image_token_id))
    take_meta(host)
    inputs = adapter.finalize(host)
    outs = [r.processor_out for r in refs if "pixel_values" in r.processor_out]
    assert tile_rows_diff(inputs["pixel_values"], [img for o in outs for img in o["pixel_values"]]) <= 1e-5
    assert torch.equal(inputs["image_sizes"], torch.cat([o["image_sizes"] for o in outs]))
    flags = [n == 1 for n in inputs["batch_num_images"].tolist() for _ in range(n)]
    assert flags == [n == 1 for o in outs for n in o["batch_num_images"].tolist() for _ in range(n)]
    assert "image_tiles" not in inputs                             # host-only: not a forward argument


@pytest.mark.parametrize("attn", ["sdpa", "vlmdata_varlen"])
def test_packed_equals_sum_of_samples(onevision, attn):
    folder, spec, refs = onevision
    check_packed_equals_alone(folder, spec, refs, attn)


def test_a_lone_one_tile_image_is_refused(onevision):
    """One-tile images (of multi-image samples) form the model's n > 1 entries; one alone cannot be said."""
    adapter = make_adapter(onevision[1])

    def entries(tiles):
        pack = {"image_tiles": torch.tensor(tiles), "image_sizes": torch.ones(len(tiles), 2, dtype=torch.int32)}
        return adapter.tile_keys(pack)["batch_num_images"].tolist()

    assert entries([5, 1, 1, 1, 2, 1, 1]) == [1, 3, 1, 2]
    with pytest.raises(AdapterError, match="stands alone"):
        entries([5, 1, 2])


def test_vlm_trainer_trains_a_sharded_corpus(onevision, tmp_path):
    """The reference corpus sharded with the tiny model's folder trains through VLMTrainer: finite losses, the
    vision tower and the newline embedding get gradients, the loss goes down over the steps."""
    from transformers import TrainingArguments

    from tests.helpers.models import shard_reference_rows
    from vlmdata import VLMDataset
    from vlmdata.hf import VLMTrainer

    folder, spec, _ = onevision
    _, expected, data = shard_reference_rows(tmp_path, folder)
    ds = VLMDataset(str(data), max_tokens=4096, rank=0, world_size=1)
    assert ModelSpec.from_dataset(ds).image_policy() == spec.image_policy()
    model = tiny_model(folder).train()
    args = TrainingArguments(output_dir=str(tmp_path / "out"), num_train_epochs=4, per_device_train_batch_size=1,
                             learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                             report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = VLMTrainer(model=model, args=args, train_dataset=ds, spec=ModelSpec.from_dataset(ds))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) >= 4 and all(np.isfinite(losses))
    per_epoch = len(losses) // 4
    assert np.mean(losses[-per_epoch:]) < np.mean(losses[:per_epoch])
    assert trainer.loader_stats.samples == 4 * len(expected)
