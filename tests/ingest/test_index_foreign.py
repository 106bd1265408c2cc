"""`vlmdata index`: shards written by the webdataset library (plain and gzip), indexed in place."""
from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from vlmdata.errors import ConfigError
from vlmdata.formats import (
    Manifest,
    SampleIndex,
    parse_index,
    read_sample,
    text_decoder_for,
)
from vlmdata.ingest import IndexConfig, index_dataset
from vlmdata.text import ByteTokenizer, encode_conversation


def _img(i: int, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (30 + i, 20 + 2 * i), (i * 7 % 256, 50, 90)).save(buf, format=fmt)
    return buf.getvalue()


def write_shards(root, pattern: str, text: str = "txt", n: int = 30, per_shard: int = 12) -> dict:
    """Samples written with webdataset.ShardWriter; returns key -> (image bytes, caption)."""
    import webdataset as wds

    root.mkdir(parents=True, exist_ok=True)
    truth = {}
    with wds.ShardWriter(str(root / pattern), maxcount=per_shard, verbose=0) as sink:
        for i in range(n):
            key = f"sample{i:05d}"
            ext = "png" if i % 5 == 0 else "jpg"
            img = _img(i, "PNG" if ext == "png" else "JPEG")
            caption = f"caption number {i} " + "word " * (i % 7)
            s = {"__key__": key, ext: img}
            if i == 7:
                s[ext] = b"definitely not an image"
            if text == "txt" and i != 11:
                s["txt"] = caption
            s["json"] = {"caption": caption, "url": f"http://x/{i}"} if text == "json" else {"url": f"http://x/{i}"}
            sink.write(s)
            if i not in (7, 11):
                truth[key] = (img, caption)
    return truth


def _check(root, manifest: Manifest, truth: dict, gz: bool) -> None:
    tok = ByteTokenizer()
    dec = text_decoder_for(manifest.layout, manifest.tokenizer)
    seen = set()
    for info in manifest.shards:
        raw = (root / info.name).read_bytes()
        assert info.bytes == len(raw)
        data = gzip.decompress(raw) if gz else raw
        index = SampleIndex.load(str(root / info.index))
        for i in range(len(index)):
            rec = read_sample(data, index, i, text_decoder=dec)
            img, caption = truth[rec.key]
            assert [bytes(b) for b in rec.images] == [img]
            assert rec.sizes == [Image.open(io.BytesIO(img)).size]
            np.testing.assert_array_equal(rec.tokens, encode_conversation(tok, [("user", ""), ("assistant", caption)], 1))
            assert int(index.text_tokens[i]) == rec.tokens.shape[1] - 1
            seen.add(rec.key)
        if gz:
            assert info.dali_index is None
        else:
            entries = parse_index((root / info.dali_index).read_bytes())
            assert [m[0].name.split(".")[0] for m in entries] == index.keys()
            for members in entries:
                for m in members:
                    assert data[m.offset - 512:m.offset - 512 + len(m.name)] == m.name.encode()
    assert seen == set(truth)


@pytest.mark.parametrize("gz", [False, True])
def test_index_webdataset_shards(tmp_path, gz):
    root = tmp_path / "wds"
    truth = write_shards(root, "part-%04d.tar" + (".gz" if gz else ""))
    names = sorted(p.name for p in root.iterdir())
    if gz:
        assert all(gzip.decompress((root / n).read_bytes())[:1] for n in names)
    m = index_dataset(IndexConfig(root=str(root), workers=2))
    assert m.layout["text"] == "txt" and (m.layout.get("compression") == "gzip") == gz
    assert len(m.shards) == 3 and m.num_samples == len(truth) == 28
    assert m.stats["skipped"] == {"missing_text": 1, "not_an_image": 1}
    assert m.stats["input_rows"] == 30
    _check(root, m, truth, gz)
    assert sorted(p.name for p in root.iterdir() if p.suffix in (".tar", ".gz")) == names  # tars untouched
    planning = np.load(root / "planning.npz")
    assert len(planning["text_tokens"]) == 28
    from vlmdata.ingest import inspect_dataset

    text = inspect_dataset(str(root), samples=1)
    assert "samples 28, images 28" in text and "[assistant] caption number 0" in text


def test_index_json_captions_and_cli(tmp_path):
    root = tmp_path / "wdsjson"
    write_shards(root, "part-%04d.tar", text="json")  # sample 11 has its caption in .json: indexed too
    r = subprocess.run([sys.executable, "-m", "vlmdata", "index", str(root), "--workers", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("indexed 3 shards") and "text from .json" in r.stdout
    m = Manifest.load(str(root))
    assert m.layout == {"text": "json", "json_field": "caption"}
    assert m.num_samples == 29 and m.stats["skipped"] == {"not_an_image": 1}


def test_index_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        index_dataset(IndexConfig(root=str(tmp_path / "nope")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no .tar"):
        index_dataset(IndexConfig(root=str(tmp_path / "empty")))
    root = tmp_path / "trunc"
    write_shards(root, "part-%04d.tar", n=10, per_shard=10)
    tar = root / "part-0000.tar"
    tar.write_bytes(tar.read_bytes()[:9000])
    m = index_dataset(IndexConfig(root=str(root), workers=0))
    assert m.stats["skipped"].get("corrupt_shard") == 1 and m.num_samples >= 1
    assert m.stats["input_rows"] == m.num_samples + sum(v for k, v in m.stats["skipped"].items() if k != "corrupt_shard")
    json.dumps(m.stats)
