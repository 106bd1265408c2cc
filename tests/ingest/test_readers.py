"""Input formats (LLaVA JSON, caption JSONL/CSV/Parquet, image folders) and image references, read by
`shard_dataset`."""
from __future__ import annotations

import csv
import io
import json

import pytest

from tests.helpers.shards import image_dir, shard, wds_samples
from vlmdata.ingest import detect_format, iter_json_array


@pytest.fixture
def images(tmp_path):
    return image_dir(tmp_path)


def test_llava_json_array_relative_absolute_and_url_refs(tmp_path, images):
    d, files = images
    rows = [
        {"id": "r0", "image": "imgs/a.jpg", "conversations": [{"from": "human", "value": "<image>\nWhat?"},
                                                               {"from": "gpt", "value": "A red box."}]},
        {"id": "r1", "images": [str(d / "b.png"), f"file://{d / 'c.jpg'}"],
         "conversations": [{"from": "user", "value": "<image> and <image>"}, {"from": "assistant", "value": "two"}]},
        {"id": "r2", "conversations": [{"from": "human", "value": "no image here"}, {"from": "gpt", "value": "ok"}]},
    ]
    (tmp_path / "data.json").write_text(json.dumps(rows, indent=2))
    assert detect_format(str(tmp_path / "data.json")) == "json"
    m = shard(tmp_path / "data.json", tmp_path / "out")
    assert m.stats["skipped_total"] == 0 and m.num_samples == 3 and m.num_images == 3
    got = wds_samples(tmp_path / "out")
    assert got["r0"]["0.jpg"] == files["a.jpg"]
    assert got["r1"]["0.png"] == files["b.png"] and got["r1"]["1.jpg"] == files["c.jpg"]
    assert not any(k[0].isdigit() for k in got["r2"])


def test_json_array_stream_parser_small_chunks():
    items = [{"id": i, "text": "x" * (i * 7), "nested": {"a": [1, 2, {"b": "]},"}]}} for i in range(50)]
    data = json.dumps(items).encode()
    got = list(iter_json_array(io.BytesIO(data), chunk_size=5))
    assert got == items
    bad = list(iter_json_array(io.BytesIO(b'[{"id": 1}, {"id": 2,, }]'), chunk_size=4))
    assert bad[0] == {"id": 1} and isinstance(bad[1], str) and "unparseable" in bad[1]
    assert len(bad) == 2


def test_caption_jsonl_csv_parquet(tmp_path, images):
    d, files = images
    rows = [{"key": "k1", "img": "imgs/a.jpg", "desc": "first"}, {"key": "k2", "img": "imgs/c.jpg", "desc": "second"}]
    with open(tmp_path / "cap.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["key", "img", "desc"])
        w.writeheader()
        w.writerows(rows)
    m = shard(tmp_path / "cap.csv", tmp_path / "csv_out", columns=_cols("img", "desc"))
    assert m.num_samples == 2 and m.stats["input_formats"] == ["csv"]
    got = wds_samples(tmp_path / "csv_out")
    assert got["k1"]["0.jpg"] == files["a.jpg"] and got["k2"]["0.jpg"] == files["c.jpg"]

    (tmp_path / "cap.jsonl").write_text("\n".join(json.dumps({"id": r["key"], "image": r["img"], "caption": r["desc"]})
                                                  for r in rows) + "\n")
    m = shard(tmp_path / "cap.jsonl", tmp_path / "jsonl_out")
    assert m.num_samples == 2 and sorted(wds_samples(tmp_path / "jsonl_out")) == ["k1", "k2"]

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"image": [{"bytes": files["b.png"], "path": None}, {"bytes": None, "path": str(d / "a.jpg")}],
                      "text": ["embedded png", "path ref"]})
    pq.write_table(table, tmp_path / "cap.parquet", row_group_size=1)
    m = shard(tmp_path / "cap.parquet", tmp_path / "pq_out")
    got = wds_samples(tmp_path / "pq_out")
    assert m.num_samples == 2 and m.stats["input_formats"] == ["parquet"]
    assert [got[k].get("0.png", got[k].get("0.jpg")) for k in sorted(got)] == [files["b.png"], files["a.jpg"]]
    meta = json.loads(got[sorted(got)[0]]["json"])
    assert meta["text"] == "embedded png" and meta["image"]["bytes"] == f"<{len(files['b.png'])} bytes>"


def test_image_folder_with_sidecars(tmp_path, images):
    d, files = images
    (d / "a.txt").write_text("caption of a")
    (d / "c.txt").write_text("caption of c")
    m = shard(d, tmp_path / "out")
    assert m.stats["input_formats"] == ["folder"]
    assert m.num_samples == 2 and m.stats["skipped"] == {"missing_text": 1}
    got = wds_samples(tmp_path / "out")
    assert got["a"]["0.jpg"] == files["a.jpg"] and json.loads(got["a"]["json"])["caption"] == "caption of a"


def _cols(image, text):
    from vlmdata.ingest import ColumnSpec

    return ColumnSpec(image=image, text=text)
