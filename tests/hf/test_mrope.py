"""M-RoPE positions of a pack equal the model's own rope index of each sample alone (Qwen2-VL, Qwen2.5-VL)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.helpers.hf import make_conversations, qwen_processor, reference_pack, references, write_qwen_folder
from vlmdata.errors import AdapterError
from vlmdata.hf import ModelSpec, mrope_position_ids


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    proc = qwen_processor()
    folder = write_qwen_folder(str(tmp_path_factory.mktemp("qwen")), proc)
    spec = ModelSpec.from_folder(folder)
    refs = references(make_conversations(12, seed=5, max_images=3), proc, "qwen2-vl", spec.image_policy())
    return folder, spec, refs


def _model(folder, family):
    from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration

    config = AutoConfig.from_pretrained(folder)
    if family == "qwen2.5-vl":
        from transformers import Qwen2_5_VLConfig

        data = config.to_dict()
        data["model_type"] = "qwen2_5_vl"
        data["vision_config"] = {"depth": 1, "hidden_size": 32, "out_hidden_size": 64, "num_heads": 2,
                                 "intermediate_size": 64, "patch_size": 14, "spatial_merge_size": 2,
                                 "temporal_patch_size": 2, "fullatt_block_indexes": [0], "window_size": 56}
        config = Qwen2_5_VLConfig.from_dict(json.loads(json.dumps(data)))
        return Qwen2_5_VLForConditionalGeneration(config)
    return Qwen2VLForConditionalGeneration(config)


@pytest.mark.parametrize("family", ["qwen2-vl", "qwen2.5-vl"])
def test_pack_positions_equal_rope_index_per_sample(qwen, family):
    folder, spec, refs = qwen
    model = _model(folder, family)
    pack = reference_pack(refs, spec.image_policy(), spec.image_token_id)
    pos = mrope_position_ids(pack["input_ids"], pack["cu_seqlens"], pack["image_grid"], spec.image_token_id,
                             spec.merge_size)
    assert pos.shape == (3, len(pack["input_ids"])) and pos.dtype == torch.int64
    bounds = pack["cu_seqlens"].tolist()
    with_images = 0
    for (a, b), ref in zip(zip(bounds[:-1], bounds[1:]), refs):
        out = ref.processor_out
        grid = out.get("image_grid_thw")
        want, _ = model.model.get_rope_index(out["input_ids"], out["mm_token_type_ids"], grid)
        assert torch.equal(pos[:, a:b], want[:, 0]), ref.key
        with_images += grid is not None
    assert with_images >= 6                                  # the corpus exercises images, several per sample


def test_text_only_pack_restarts_per_sample():
    cu = torch.tensor([0, 3, 3, 7], dtype=torch.int32)          # an empty segment in the middle
    pos = mrope_position_ids(torch.arange(7), cu, None, image_token_id=99, merge_size=2)
    assert pos.tolist() == [[0, 1, 2, 0, 1, 2, 3]] * 3


def test_image_layout_by_hand():
    # one sample: text, a 4x6-patch image (2x3 merged tokens), text; then a second sample with a 2x2 image
    img = 9
    ids = torch.tensor([1, 2, img, img, img, img, img, img, 3, 4, img, 5])
    grid = torch.tensor([[1, 4, 6], [1, 2, 2]])
    pos = mrope_position_ids(ids, torch.tensor([0, 10, 12]), grid, img, merge_size=2)
    # image 1 starts at p=2: t=2, h=2+row, w=2+col; then p = 2 + max(2, 3) = 5
    assert pos[0].tolist()[:10] == [0, 1, 2, 2, 2, 2, 2, 2, 5, 6]
    assert pos[1].tolist()[:10] == [0, 1, 2, 2, 2, 3, 3, 3, 5, 6]
    assert pos[2].tolist()[:10] == [0, 1, 2, 3, 4, 2, 3, 4, 5, 6]
    assert pos[:, 10:].tolist() == [[0, 1], [0, 1], [0, 1]]      # the second sample restarts at 0


def test_adjacent_images_are_laid_out_one_after_the_other():
    img = 9
    ids = torch.tensor([1] + [img] * 2 + [img] * 1 + [2])
    pos = mrope_position_ids(ids, torch.tensor([0, 5]), torch.tensor([[1, 2, 4], [1, 2, 2]]), img, merge_size=2)
    assert pos.tolist() == [[0, 1, 1, 3, 4], [0, 1, 1, 3, 4], [0, 1, 2, 3, 4]]


def test_bad_packs_are_clear_errors():
    img = 9
    grid = torch.tensor([[1, 4, 4]])                              # 4 tokens
    with pytest.raises(AdapterError, match="3 image tokens but its 1 images take 4"):
        mrope_position_ids(torch.tensor([1, img, img, img]), torch.tensor([0, 4]), grid, img, 2)
    with pytest.raises(AdapterError, match="split by other tokens"):
        mrope_position_ids(torch.tensor([img, img, 1, img, img]), torch.tensor([0, 5]), grid, img, 2)
    with pytest.raises(AdapterError, match="cross a sample boundary"):
        mrope_position_ids(torch.tensor([1, img, img, img, img]), torch.tensor([0, 3, 5]), grid, img, 2)
    with pytest.raises(AdapterError, match="multiples of the merge size"):
        mrope_position_ids(torch.tensor([img] * 4), torch.tensor([0, 4]), torch.tensor([[1, 3, 4]]), img, 2)
    with pytest.raises(AdapterError, match="must rise from 0"):
        mrope_position_ids(torch.tensor([1, 2]), torch.tensor([0, 3]), None, img, 2)


def test_vectorised_over_a_long_pack():
    rng = np.random.default_rng(0)
    img, parts, grids, cu = 9, [], [], [0]
    for _ in range(200):
        n = int(rng.integers(1, 40))
        sample = list(rng.integers(10, 20, n))
        if rng.random() < 0.5:
            h, w = 2 * int(rng.integers(1, 6)), 2 * int(rng.integers(1, 6))
            grids.append([1, h, w])
            sample += [img] * (h * w // 4) + [11]
        parts += sample
        cu.append(len(parts))
    pos = mrope_position_ids(torch.tensor(parts), torch.tensor(cu), torch.tensor(grids), img, 2)
    starts = pos[:, torch.tensor(cu[:-1])]
    assert bool((starts == 0).all())                              # every sample starts at 0 on all three axes
    assert int(pos.max()) < 80
