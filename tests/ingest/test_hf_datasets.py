"""Hugging Face `datasets` inputs: a Dataset with Image features, an IterableDataset and a save_to_disk folder
shard to the same samples (stored images and tokens) as the JSONL they were built from; several workers."""
from __future__ import annotations

import json
import pickle

import pytest

from tests.helpers.corpus import generate_corpus
from tests.helpers.shards import read_jsonl, shard, stored_members
from vlmdata.errors import ConfigError
from vlmdata.ingest import (
    RangedDataset,
    Row,
    ShardConfig,
    dataset_inputs,
    fill_rows,
    open_inputs,
    shard_dataset,
)

datasets = pytest.importorskip("datasets")


def _image(path) -> dict:
    return {"bytes": path.read_bytes(), "path": None}


def build_dataset(corpus, fmt: str):
    """The generator's rows as a datasets.Dataset whose images are datasets.Image features (bytes inside)."""
    rows = read_jsonl(corpus / "data.jsonl")
    Image, List, Value = datasets.Image, datasets.List, datasets.Value
    if fmt == "llava":
        features = datasets.Features({"id": Value("string"), "images": List(Image()),
                                      "conversations": List({"from": Value("string"), "value": Value("string")})})
        rows = [{**r, "images": [_image(corpus / p) for p in r["images"]]} for r in rows]
    elif fmt == "caption":
        features = datasets.Features({"id": Value("string"), "image": Image(), "caption": Value("string")})
        rows = [{**r, "image": _image(corpus / r["image"])} for r in rows]
    else:   # openai: the item images go to an `images` column, the items keep {"type": "image"}
        features = datasets.Features({
            "id": Value("string"), "images": List(Image()),
            "messages": List({"role": Value("string"),
                              "content": List({"type": Value("string"), "text": Value("string")})})})
        out = []
        for r in rows:
            images = [_image(corpus / i["image_url"]["url"]) for m in r["messages"] if isinstance(m["content"], list)
                      for i in m["content"] if i["type"] == "image_url"]
            messages = [{"role": m["role"], "content": [
                {"type": "image", "text": None} if i["type"] == "image_url" else i for i in m["content"]]
                if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]}
                for m in r["messages"]]
            out.append({"id": r["id"], "images": images, "messages": messages})
        rows = out
    return datasets.Dataset.from_list(rows, features=features)


@pytest.mark.parametrize("fmt", ["llava", "caption", "openai"])
def test_dataset_objects_shard_like_their_jsonl(tmp_path, fmt):
    corpus = generate_corpus(tmp_path / "corpus", 9, seed=6, fmt=fmt)
    ds = build_dataset(corpus, fmt)
    reference = shard(corpus / "data.jsonl", tmp_path / "jsonl")
    expected = stored_members(tmp_path / "jsonl")
    assert reference.stats["skipped"] == {} and len(expected) == 9
    workers = 2 if fmt == "llava" else 0
    m = shard_dataset(ShardConfig(inputs=[ds], output=str(tmp_path / "ds"), workers=workers,
                                  max_samples_per_shard=4))
    assert m.stats["skipped"] == {} and m.stats["input_formats"] == ["hf-dataset"] and len(m.shards) == 3
    assert stored_members(tmp_path / "ds") == expected
    it = ds.to_iterable_dataset(num_shards=3)
    shard_dataset(ShardConfig(inputs=[it], output=str(tmp_path / "it"), workers=0))
    assert stored_members(tmp_path / "it") == expected


def test_saved_dataset_folder_and_dataset_dict(tmp_path):
    corpus = generate_corpus(tmp_path / "corpus", 6, seed=7, fmt="caption")
    ds = build_dataset(corpus, "caption")
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dict"))
    shard(corpus / "data.jsonl", tmp_path / "jsonl")
    m = shard(tmp_path / "saved", tmp_path / "out", workers=2)
    assert m.stats["input_formats"] == ["hf-dataset"] and m.num_samples == 6
    assert stored_members(tmp_path / "out") == stored_members(tmp_path / "jsonl")
    with pytest.raises(ConfigError, match=r"saved DatasetDict \(splits train\); pass one split's folder"):
        shard(tmp_path / "dict", tmp_path / "never")


def test_bad_dataset_rows_are_counted(tmp_path):
    corpus = generate_corpus(tmp_path / "corpus", 4, seed=8, fmt="caption")
    rows = read_jsonl(corpus / "data.jsonl")
    ds = datasets.Dataset.from_list(
        [{"id": r["id"], "image": {"bytes": (corpus / r["image"]).read_bytes(), "path": None}, "caption": r["caption"]}
         for r in rows] + [{"id": "junk", "image": {"bytes": b"not an image", "path": None}, "caption": "x"},
                           {"id": "none", "image": None, "caption": "x"}],
        features=datasets.Features({"id": datasets.Value("string"), "image": datasets.Image(),
                                    "caption": datasets.Value("string")}))
    m = shard_dataset(ShardConfig(inputs=[ds], output=str(tmp_path / "out"), workers=0))
    assert m.num_samples == 4 and m.stats["skipped"] == {"not_an_image": 1, "missing_image_ref": 1}


def test_memory_mapped_datasets_are_read_by_index_in_the_workers(tmp_path):
    corpus = generate_corpus(tmp_path / "corpus", 10, seed=11, fmt="llava")
    build_dataset(corpus, "llava").save_to_disk(str(tmp_path / "saved"))
    picked = [7, 1, 2, 9, 4, 0]
    ds = datasets.load_from_disk(str(tmp_path / "saved")).select(picked)   # an indices mapping over the file
    rows = read_jsonl(corpus / "data.jsonl")
    (tmp_path / "picked.jsonl").write_text("".join(json.dumps(rows[i]) + "\n" for i in picked))
    shard(tmp_path / "picked.jsonl", tmp_path / "ref", image_root=str(corpus))
    m = shard_dataset(ShardConfig(inputs=[ds], output=str(tmp_path / "out"), workers=2, max_samples_per_shard=4))
    assert m.num_samples == 6 and m.stats["skipped"] == {}
    assert stored_members(tmp_path / "out") == stored_members(tmp_path / "ref")


def test_what_travels_to_the_workers(tmp_path):
    """Memory-mapped inputs send ids and a small handle; in-memory and iterable ones send whole rows."""
    corpus = generate_corpus(tmp_path / "corpus", 6, seed=12, fmt="caption")
    in_memory = build_dataset(corpus, "caption")
    in_memory.save_to_disk(str(tmp_path / "saved"))
    mapped = datasets.load_from_disk(str(tmp_path / "saved"))
    inputs = [str(tmp_path / "saved"), mapped, in_memory, in_memory.to_iterable_dataset()]
    sources = open_inputs(inputs, None)
    given, handles = dataset_inputs(inputs, sources, ("id",), {})
    image_bytes = sum(len(r["image"]["bytes"]) for r in in_memory.with_format("arrow")[:].to_pylist())
    assert image_bytes > 100_000
    assert [h.source for h in handles] == [0, 1] and len(pickle.dumps(handles)) < 20_000
    for i in (0, 1):
        assert given[i][1] is True and list(given[i][0]) == [{"id": r["id"]} for r in read_jsonl(corpus / "data.jsonl")]
    for i in (2, 3):
        assert given[i][1] is False and all(r["image"]["bytes"] for r in given[i][0])


def test_an_unreadable_range_counts_its_rows(tmp_path):
    corpus = generate_corpus(tmp_path / "corpus", 4, seed=13, fmt="caption")
    build_dataset(corpus, "caption").save_to_disk(str(tmp_path / "saved"))
    rows = [Row(0, n, {"id": f"r{n}"}, partial=True) for n in range(4)]
    fill_rows(rows, (RangedDataset(0, str(tmp_path / "gone")),), {})
    assert all(r.data is None and "rows 0-3 of the dataset cannot be read" in r.error for r in rows)
    rows = [Row(0, n, {"id": f"r{n}"}, partial=True) for n in (1, 2)]
    fill_rows(rows, (RangedDataset(0, str(tmp_path / "saved")),), {})
    assert [r.data["id"] for r in rows] == [r["id"] for r in read_jsonl(corpus / "data.jsonl")[1:3]]
