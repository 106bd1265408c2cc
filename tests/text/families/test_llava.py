"""LLaVA-1.5 against transformers' own LlavaProcessor (a small LLaMA-style tokenizer built with `tokenizers`,
the LLaVA-1.5 chat template with its {% generation %} blocks): ids bitwise equal, 576 image tokens at 336 px,
trained positions equal to the processor's assistant mask."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.models import llava_processor, samples_of, shard_reference_rows
from vlmdata import VLMDataset
from vlmdata.errors import ConfigError
from vlmdata.testing import llava_folder
from vlmdata.text.families import load_family


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return llava_folder(tmp_path_factory.mktemp("llava"))


def test_family_and_policy(llava):
    fam = load_family(str(llava))
    assert fam.name == "llava" and fam.vision.image_size == 336
    assert fam.vision.image_policy().tokens_per_image == 576
    assert fam.bos_token_id == 1 and fam.template.has_generation


def test_sharded_and_loaded_ids_and_mask_equal_the_hf_processor(llava, tmp_path):
    _, expected, data = shard_reference_rows(tmp_path, llava)
    got = {}
    for batch in VLMDataset(str(data), max_tokens=1 << 16, max_images=64):
        got.update(samples_of(batch))
    proc = llava_processor(llava)
    for n, (messages, images) in enumerate(expected):
        out = proc.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                       images=images or None, return_tensors="np")
        ref, mask = out["input_ids"][0], np.asarray(out["assistant_masks"][0]) != 0
        ids, labels = got[f"conv{n}"]
        assert np.array_equal(ids, ref), f"conv{n}"
        assert int((ref == proc.tokenizer.convert_tokens_to_ids("<image>")).sum()) == 576 * len(images)
        assert mask.any() and np.array_equal(labels != -100, mask), f"conv{n}"


def test_unsupported_llava_variant_is_a_clear_error(llava):
    import json

    cfg = json.loads((llava / "processor_config.json").read_text())
    (llava / "processor_config.json").write_text(json.dumps({**cfg, "vision_feature_select_strategy": "full"}))
    try:
        with pytest.raises(ConfigError, match="not supported"):
            load_family(str(llava))
    finally:
        (llava / "processor_config.json").write_text(json.dumps(cfg))


def test_loaded_pixels_equal_the_clip_processor_resize_and_crop(llava, tmp_path):
    """Issue 21: the default loader's pixels are the CLIP processor's (shortest side to 336, centre crop)."""
    import json

    import torch

    from tests.helpers.exact_pixels import hf_pixels, max_diff
    from vlmdata.hf import ModelSpec, make_adapter, take_meta

    rows, _, data = shard_reference_rows(tmp_path, llava)
    files = {json.loads(line)["id"]: json.loads(line)["images"] for line in rows.read_text().splitlines()}
    image_processor = llava_processor(llava).image_processor
    ds = VLMDataset(str(data), max_tokens=1 << 16, max_images=64, rank=0, world_size=1)
    adapter = make_adapter(ModelSpec.from_dataset(ds))
    compared = 0
    for pack in ds:
        host = adapter(pack)
        keys = take_meta(host)["sample_keys"]
        refs = [hf_pixels(image_processor, (rows.parent / f).read_bytes()) for k in keys for f in files[k]]
        if refs:
            got = adapter.finalize(host)["pixel_values"]
            assert max_diff(got, torch.cat([r["pixel_values"] for r in refs])) <= 1e-5
            compared += len(refs)
    assert compared == sum(len(v) for v in files.values()) >= 10
