"""`data:` image URLs in every row layout: the same stored images as the files they encode; malformed,
oversized and non-image data URLs skipped and counted."""
from __future__ import annotations

import base64
import csv
import json

import pytest

from tests.helpers.corpus import generate_corpus
from tests.helpers.models import qwen_folder_or_skip
from tests.helpers.shards import read_jsonl, shard, stored_members, wds_samples
from vlmdata.ingest import RetokenizeConfig, retokenize_dataset


def _data_url(path, variant: str = "plain") -> str:
    raw = path.read_bytes()
    if variant == "urlsafe":   # URL-safe alphabet, padding dropped
        return "data:image/jpeg;base64," + base64.urlsafe_b64encode(raw).decode().rstrip("=")
    text = base64.b64encode(raw).decode()
    if variant == "wrapped":   # MIME-style 76-column lines
        text = "\n".join(text[i:i + 76] for i in range(0, len(text), 76))
    return f"data:image/jpeg;base64,{text}"


def _embed(rec: dict, corpus, variant: str) -> dict:
    """The record with every image path replaced by its data URL (openai, llava and caption layouts)."""
    rec = json.loads(json.dumps(rec))
    for m in rec.get("messages", []):
        for item in m["content"] if isinstance(m["content"], list) else []:
            if item["type"] == "image_url":
                item["image_url"]["url"] = _data_url(corpus / item["image_url"]["url"], variant)
    if "images" in rec:
        rec["images"] = [_data_url(corpus / p, variant) for p in rec["images"]]
    if "image" in rec:
        rec["image"] = _data_url(corpus / rec["image"], variant)
    return rec


@pytest.mark.parametrize("fmt, variant", [("openai", "plain"), ("llava", "wrapped"), ("caption", "urlsafe")])
def test_data_urls_store_the_same_images_as_files(tmp_path, fmt, variant):
    corpus = generate_corpus(tmp_path / "corpus", 10, seed=3, fmt=fmt)
    rows = [_embed(r, corpus, variant) for r in read_jsonl(corpus / "data.jsonl")]
    (tmp_path / "embedded").mkdir()   # elsewhere: nothing can be read from beside it
    (tmp_path / "embedded" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    files = shard(corpus / "data.jsonl", tmp_path / "files")
    embedded = shard(tmp_path / "embedded" / "rows.jsonl", tmp_path / "urls")
    assert embedded.stats["skipped"] == {} and embedded.num_samples == files.num_samples == 10
    assert embedded.stats["images"] == files.stats["images"] > 0
    assert stored_members(tmp_path / "urls") == stored_members(tmp_path / "files")
    record = json.loads(next(iter(wds_samples(tmp_path / "urls").values()))["json"])
    assert len(json.dumps(record)) < 4000, "the stored record holds the images a second time"


def test_data_urls_in_a_csv_table(tmp_path):
    corpus = generate_corpus(tmp_path / "corpus", 5, seed=2, fmt="csv")
    with open(corpus / "data.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    (tmp_path / "t").mkdir()
    with open(tmp_path / "t" / "urls.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["id", "image", "caption"])
        w.writeheader()
        w.writerows({**r, "image": _data_url(corpus / r["image"])} for r in rows)
    shard(corpus / "data.csv", tmp_path / "files")
    m = shard(tmp_path / "t" / "urls.csv", tmp_path / "urls")
    assert m.stats["skipped"] == {} and m.num_samples == 5
    assert stored_members(tmp_path / "urls") == stored_members(tmp_path / "files")


def test_malformed_and_oversized_data_urls_are_counted(tmp_path):
    corpus = generate_corpus(tmp_path / "corpus", 3, seed=4, fmt="caption")
    good = read_jsonl(corpus / "data.jsonl")[0]
    url = _data_url(corpus / good["image"])
    cases = {
        "ok": url,
        "bad_b64": "data:image/jpeg;base64,/9j/4AAQ$$$not base64",
        "truncated": url[:len("data:image/jpeg;base64,") + 5],
        "no_comma": "data:image/jpeg;base64",
        "text_type": "data:text/plain;base64," + base64.b64encode(b"hello").decode(),
        "not_image": "data:image/png;base64," + base64.b64encode(b"plain words, no image").decode(),
        "too_large": "data:image/jpeg;base64," + "A" * 40_000,
        "video": "data:video/mp4;base64,AAAAIGZ0eXBpc29t",
        "percent": "data:image/jpeg," + "".join(f"%{b:02x}" for b in (corpus / good["image"]).read_bytes()),
    }
    rows = [{"id": k, "image": v, "caption": "a caption"} for k, v in cases.items()]
    rows.append({"id": "string-item", "messages": [   # an image_url item given as a plain string
        {"role": "user", "content": [{"type": "image_url", "image_url": url}, {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": "A picture."}]})
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = shard(tmp_path / "rows.jsonl", tmp_path / "out", max_image_bytes=20_000)
    assert m.stats["skipped"] == {"bad_data_url": 4, "not_an_image": 1, "file_too_large": 1,
                                  "video_unsupported": 1}
    assert m.num_samples == 3 and m.stats["input_rows"] == len(rows)
    got = stored_members(tmp_path / "out")
    image = (corpus / good["image"]).read_bytes()
    assert got["ok"]["0.jpg"] == got["percent"]["0.jpg"] == got["string-item"]["0.jpg"] == image
    assert "base64" in m.stats["examples"]["bad_data_url"]["detail"]
    assert "A" * 100 not in json.dumps(m.stats["examples"]), "a skip detail quotes the payload"


def test_records_with_cut_data_urls_retokenize(tmp_path):
    """The stored record keeps a cut data URL per image, so `vlmdata retokenize` still counts every image."""
    corpus = generate_corpus(tmp_path / "corpus", 6, seed=15, fmt="openai")
    rows = [_embed(r, corpus, "plain") for r in read_jsonl(corpus / "data.jsonl")]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = qwen_folder_or_skip()
    m = shard(tmp_path / "rows.jsonl", tmp_path / "out", tokenizer=str(model))
    assert m.num_samples == 6
    result = retokenize_dataset(RetokenizeConfig(dataset=str(tmp_path / "out"), tokenizer=str(model), view="again",
                                                 workers=0))
    assert result.encoded == result.samples == 6 and result.skipped == {}
