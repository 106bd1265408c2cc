"""Each input format, image references, validation reasons and configuration errors."""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from shard_fixtures import shard, wds_samples

from vlmdata.errors import ConfigError
from vlmdata.ingest import detect_format, iter_json_array


def jpeg(w=40, h=30, color=(200, 10, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def png(w=20, h=24) -> bytes:
    buf = io.BytesIO()
    Image.new("RGBA", (w, h), (0, 100, 200, 128)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def images(tmp_path):
    d = tmp_path / "imgs"
    d.mkdir()
    files = {"a.jpg": jpeg(40, 30), "b.png": png(20, 24), "c.jpg": jpeg(64, 48, (0, 200, 0))}
    for name, data in files.items():
        (d / name).write_bytes(data)
    return d, files


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


def test_every_bad_input_is_skipped_and_counted(tmp_path, images):
    d, files = images
    (d / "trunc.png").write_bytes(png(30, 30)[:-12])
    (d / "big.jpg").write_bytes(jpeg(300, 300))

    def conv(q, a="answer"):
        return [{"from": "human", "value": q}, {"from": "gpt", "value": a}]

    lines = [
        json.dumps({"id": "ok", "image": "imgs/a.jpg", "conversations": conv("<image>hi")}),
        "{not json",
        json.dumps({"id": "bomb", "image": "imgs/big.jpg", "conversations": conv("<image>")}),
        json.dumps({"id": "trunc", "image": "imgs/trunc.png", "conversations": conv("<image>")}),
        json.dumps({"id": "markers", "image": "imgs/a.jpg", "conversations": conv("<image><image>")}),
        json.dumps({"id": "empty", "image": "imgs/a.jpg", "conversations": conv("<image>", "")[:1]}),
        json.dumps({"id": "ok", "image": "imgs/c.jpg", "conversations": conv("<image>again")}),
        json.dumps({"id": "nonstr", "conversations": conv("q", 42)}),
        json.dumps({"id": "dir", "image": "imgs", "conversations": conv("<image>")}),
    ]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    m = shard(tmp_path / "d.jsonl", tmp_path / "out", max_image_pixels=200 * 200, max_samples_per_shard=3)
    assert m.stats["skipped"] == {"bad_row": 1, "decompression_bomb": 1, "truncated_image": 1,
                                  "marker_mismatch": 1, "empty_text": 1, "duplicate_key": 1, "bad_text": 1,
                                  "missing_file": 1}
    assert m.num_samples == 1 and m.stats["input_rows"] == 9
    assert m.stats["examples"]["duplicate_key"]["row"] == 6


def test_resize_and_shard_byte_limit(tmp_path):
    (tmp_path / "imgs").mkdir()
    lines = []
    for i in range(6):
        (tmp_path / "imgs" / f"{i}.jpg").write_bytes(jpeg(200 + i, 100))
        lines.append(json.dumps({"id": f"s{i}", "image": f"imgs/{i}.jpg", "caption": "c" * 30000}))
    (tmp_path / "d.jsonl").write_text("\n".join(lines))
    m = shard(tmp_path / "d.jsonl", tmp_path / "out", resize_max_side=64, quality=80, max_shard_bytes=100_000)
    assert len(m.shards) > 1 and all(s.name.startswith("shard-000000-") for s in m.shards)
    assert all(s.bytes <= 100_000 or s.samples == 1 for s in m.shards)
    got = wds_samples(tmp_path / "out")
    from vlmdata.formats import SampleIndex

    index = SampleIndex.load(str(tmp_path / "out" / m.shards[0].index))
    for i, key in enumerate(index.keys()):
        im = Image.open(io.BytesIO(got[key]["0.jpg"]))
        assert max(im.size) == 64 and im.size == (int(index.width[i]), int(index.height[i]))


def test_no_fsync_writes_the_same_bytes(tmp_path, images):
    from shard_fixtures import tar_tree

    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"id": f"x{i}", "image": "imgs/a.jpg", "caption": "c"}) + "\n"
                                              for i in range(5)))
    shard(tmp_path / "d.jsonl", tmp_path / "a", max_samples_per_shard=2)
    shard(tmp_path / "d.jsonl", tmp_path / "b", max_samples_per_shard=2, fsync=False)
    assert tar_tree(tmp_path / "a") == tar_tree(tmp_path / "b") and len(tar_tree(tmp_path / "a")) == 9


@pytest.mark.parametrize("kwargs, message", [
    ({"format": "zip"}, "unknown output format"),
    ({"format": "memmap"}, "needs --image-size"),
    ({"input_format": "xml"}, "unknown input format"),
    ({"engine": "spark"}, "unknown engine"),
    ({"tokenizer": "/nonexistent/tokenizer.json"}, "cannot load tokenizer"),
])
def test_config_errors_stop_at_once(tmp_path, images, kwargs, message):
    (tmp_path / "d.jsonl").write_text(json.dumps({"id": "x", "image": "imgs/a.jpg", "caption": "c"}) + "\n")
    with pytest.raises(ConfigError, match=message):
        shard(tmp_path / "d.jsonl", tmp_path / "out", **kwargs)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_config_errors_input_output(tmp_path, images):
    (tmp_path / "d.jsonl").write_text(json.dumps({"id": "x", "image": "imgs/a.jpg", "caption": "c"}) + "\n")
    with pytest.raises(ConfigError, match="does not exist"):
        shard(tmp_path / "missing.jsonl", tmp_path / "out")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match="cannot write to output"):
        shard(tmp_path / "d.jsonl", tmp_path / "afile" / "out")
    shard(tmp_path / "d.jsonl", tmp_path / "out")
    with pytest.raises(ConfigError, match="--resume"):
        shard(tmp_path / "d.jsonl", tmp_path / "out")
    with pytest.raises(ConfigError, match="different settings"):
        shard(tmp_path / "d.jsonl", tmp_path / "out", resume=True, max_samples_per_shard=7)
    r = subprocess.run([sys.executable, "-m", "vlmdata", "shard", str(tmp_path / "d.jsonl"), "-o",
                        str(tmp_path / "out2"), "--format", "zip"], capture_output=True, text=True)
    assert r.returncode == 2 and "error: unknown output format 'zip'" in r.stderr


def test_hf_tokenizer_file(tmp_path, images):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "red": 1, "box": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tok.json"))
    (tmp_path / "d.jsonl").write_text(json.dumps({"id": "x", "image": "imgs/a.jpg", "caption": "red box"}) + "\n")
    m = shard(tmp_path / "d.jsonl", tmp_path / "out", tokenizer=str(tmp_path / "tok.json"))
    assert m.tokenizer["name"] == "hf-tokenizers"
    tokens = np.load(io.BytesIO(wds_samples(tmp_path / "out")["x"]["tok.npy"]))
    assert [1, 2] == [int(t) for t in tokens[0] if t in (1, 2)]
