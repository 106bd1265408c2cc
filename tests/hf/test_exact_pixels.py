"""Issue 21, end to end: a corpus sharded with a real model folder and loaded with the defaults gives, through the
output adapter, the `pixel_values` of the model's own image processor (transformers' PIL backend on the files as
`load_image` opens them), bit for bit; `pixels="fast"` is the explicit approximate mode."""
from __future__ import annotations

import json

import pytest

from tests.helpers.exact_pixels import shard_image_corpus, worst_pixel_diff
from tests.helpers.models import QWEN_TEST_PIXELS, qwen_folder_or_skip, qwen_processor
from vlmdata import DatasetOptions, ShardConfig, VLMDataset, shard_dataset
from vlmdata.errors import ConfigError


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = qwen_folder_or_skip(**QWEN_TEST_PIXELS)
    root, by_key = shard_image_corpus(folder, tmp_path_factory.mktemp("exact"))
    return root, qwen_processor(folder), by_key


def test_default_loader_pixels_equal_the_image_processor(corpus):
    root, processor, by_key = corpus
    worst, seen, mode = worst_pixel_diff(root, processor, by_key)
    assert mode == "exact" and seen == len(by_key)
    assert worst <= 1e-5


def test_fast_mode_is_explicit_and_not_exact(corpus):
    root, processor, by_key = corpus
    worst, seen, mode = worst_pixel_diff(root, processor, by_key, pixels="fast")
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
