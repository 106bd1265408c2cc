"""`show_samples` on a real sharded dataset: location, token counts, trained spans (exactly the loss-flagged
tokens), the source record, the images written to files byte for byte; missing keys reported."""
import json

import numpy as np
import pytest

from tests.helpers.shards import read_jsonl, shard
from vlmdata.formats import SampleIndex
from vlmdata.ingest import render_text, show_samples
from vlmdata.keyindex import lookup_sample
from vlmdata.text import ByteTokenizer


@pytest.fixture(scope="module")
def dataset(small_llava_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("show") / "ds"
    m = shard(small_llava_corpus / "data.jsonl", out, max_samples_per_shard=30)
    records = {r["id"]: r for r in read_jsonl(small_llava_corpus / "data.jsonl")}
    return out, m, records


def test_report_of_a_sample(dataset, tmp_path):
    out, m, records = dataset
    index = SampleIndex.load(str(out / m.shards[2].index))
    key = next(k for i, k in enumerate(index.keys()) if index.n_images[i] >= 1)
    row = index.keys().index(key)
    text, missing = show_samples(str(out), [key, "no-such-key"], images_dir=str(tmp_path / "imgs"), as_json=True)
    report = json.loads(text)
    assert missing == ["no-such-key"] and report["missing"] == ["no-such-key"]
    (r,) = report["samples"]
    found = lookup_sample(str(out), key)
    tokens = found.record.tokens
    assert (r["shard"], r["row"], r["shard_file"], r["offset"]) == (2, row, m.shards[2].name, int(index.offset[row]))
    assert r["tokens"] == tokens.shape[1] and r["image_placeholders"] == int(index.n_images[row])
    assert r["trained_tokens"] == int(tokens[1].sum())
    tok = ByteTokenizer()
    trained_text = tok.decode(tokens[0][tokens[1] == 1])
    assert "".join(s["text"].replace("<eos>", "") for s in r["trained_spans"]) == trained_text
    answer = records[key]["conversations"][-1]["value"]
    assert r["trained_spans"][-1]["text"] == answer + "<eos>"
    assert "[user]" in r["text"] and "[assistant]" in r["text"] and "<image " in r["text"]
    assert r["metadata"]["id"] == key
    for j, im in enumerate(r["images"]):
        with open(im["file"], "rb") as f:
            assert f.read() == bytes(found.record.images[j])
        assert im["file"].endswith(f"{key}.{j}.jpg")


def test_text_report_and_rendering(dataset):
    out, m, _ = dataset
    key = SampleIndex.load(str(out / m.shards[0].index)).keys()[3]
    text, missing = show_samples(str(out), [key])
    assert missing == [] and text.startswith(f"sample {key}")
    for part in ("  where     shard 0 of", "row 3", "  tokens    ", "trained in", "  metadata  {", "  text",
                 "  trained spans"):
        assert part in text
    rec = lookup_sample(str(out), key).record
    rendered = render_text(m, rec.tokens, rec.sizes)
    spans = [(a, b) for a, b, _ in rendered.trained]
    flags = np.zeros(rec.tokens.shape[1], bool)
    for a, b in spans:
        flags[a:b] = True
    assert np.array_equal(flags, rec.tokens[1] == 1)
