"""Issue 21, end to end: a corpus sharded with a real model folder and loaded with the defaults gives, through the
output adapter, the `pixel_values` of the model's own image processor (transformers' PIL backend on the files as
`load_image` opens them), bit for bit; `pixels="fast"` is the explicit approximate mode."""
from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.exact_pixels import hf_pixels, max_diff, sized_jpegs
from tests.helpers.image_zoo import zoo
from tests.helpers.models import QWEN_TEST_PIXELS, qwen_folder_or_skip, qwen_processor
from vlmdata import DatasetOptions, ShardConfig, VLMDataset, shard_dataset
from vlmdata.errors import ConfigError
from vlmdata.hf import ModelSpec, make_adapter, take_meta


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = qwen_folder_or_skip(**QWEN_TEST_PIXELS)
    tmp = tmp_path_factory.mktemp("exact")
    raw = tmp / "raw"
    raw.mkdir()
    z = zoo()
    images = {**sized_jpegs(), **{k: z[k] for k in ("jpeg_exif_6", "jpeg_exif_5", "palette_png_trns", "cmyk_jpeg")}}
    files = {}
    for name, data in images.items():
        files[name] = f"{name}.img"
        (raw / files[name]).write_bytes(data)
    names = list(files)
    rows = []
    for i in range(0, len(names), 2):
        group = names[i:i + 2]
        content = [{"type": "image"} for _ in group] + [{"type": "text", "text": f"Describe picture {i}."}]
        rows.append({"id": f"s{i:02d}", "images": [files[n] for n in group],
                     "messages": [{"role": "user", "content": content},
                                  {"role": "assistant", "content": [{"type": "text", "text": "A picture."}]}]})
    (raw / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shard_dataset(ShardConfig(inputs=[str(raw / "rows.jsonl")], output=str(tmp / "ds"), tokenizer=str(folder),
                              workers=0, max_samples_per_shard=3))
    by_key = {r["id"]: [images[n.removesuffix(".img")] for n in r["images"]] for r in rows}
    return str(tmp / "ds"), qwen_processor(folder).image_processor, by_key


def _worst(root: str, image_processor, by_key: dict, **options) -> tuple[float, int, str]:
    ds = VLMDataset(root, max_tokens=1 << 16, max_images=64, rank=0, world_size=1,
                    options=DatasetOptions(**options))
    adapter = make_adapter(ModelSpec.from_dataset(ds))
    worst, seen = 0.0, 0
    for batch in map(adapter, ds):
        keys = take_meta(batch)["sample_keys"]
        got = adapter.finalize(batch)
        refs = [hf_pixels(image_processor, data) for k in keys for data in by_key[k]]
        want = torch.cat([r["pixel_values"] for r in refs])
        assert torch.equal(got["image_grid_thw"], torch.cat([r["image_grid_thw"] for r in refs]))
        worst = max(worst, max_diff(got["pixel_values"], want))
        seen += len(keys)
    return worst, seen, ds.pixels


def test_default_loader_pixels_equal_the_image_processor(corpus):
    root, image_processor, by_key = corpus
    worst, seen, mode = _worst(root, image_processor, by_key)
    assert mode == "exact" and seen == len(by_key)
    assert worst <= 1e-5


def test_fast_mode_is_explicit_and_not_exact(corpus):
    root, image_processor, by_key = corpus
    worst, seen, mode = _worst(root, image_processor, by_key, pixels="fast")
    assert mode == "fast" and seen == len(by_key)
    assert worst > 0.01


def test_exact_pixels_that_cannot_be_given_are_refused(corpus, tmp_path):
    from tests.helpers.dataset import make_samples, write_dataset

    root = corpus[0]
    with pytest.raises(ConfigError, match="decoder='turbo' decodes fast pixels only"):
        VLMDataset(root, decoder="turbo", options=DatasetOptions(pixels="exact"))
    with pytest.raises(ConfigError, match="defer_decode"):
        VLMDataset(root, options=DatasetOptions(pixels="exact", defer_decode=True))
    assert VLMDataset(root, decoder="turbo").pixels == "fast"     # a fast decoder chosen by name: fast by default
    write_dataset(str(tmp_path / "plain"), make_samples(4, seed=1), shard_size=4)
    with pytest.raises(ConfigError, match="no model family"):
        VLMDataset(str(tmp_path / "plain"), image_size=56, options=DatasetOptions(pixels="exact"))
    assert VLMDataset(str(tmp_path / "plain"), image_size=56).pixels == "fast"


def test_default_sharding_stores_the_original_bytes(corpus):
    """Exactness needs the originals: the default keeps every image's bytes as they came."""
    from vlmdata import lookup_sample

    root, _, by_key = corpus
    for key, originals in by_key.items():
        assert [bytes(b) for b in lookup_sample(root, key).record.images] == originals, key


def test_resizing_at_shard_time_with_a_model_folder_warns(corpus, tmp_path, caplog):
    folder = qwen_folder_or_skip(**QWEN_TEST_PIXELS)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"},
                                                        {"role": "assistant", "content": "ho"}]}) + "\n")
    with caplog.at_level("WARNING", logger="vlmdata.ingest.shard"):
        shard_dataset(ShardConfig(inputs=[str(rows)], output=str(tmp_path / "ds"), tokenizer=str(folder), workers=0,
                                  resize_max_side=512))
    assert "--resize-max-side stores images resized" in caplog.text and "qwen2_vl" in caplog.text
