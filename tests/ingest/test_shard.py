"""`shard_dataset`: every bad input skipped and counted by reason, resizing and the shard byte limit, fsync off,
configuration errors, a Hugging Face tokenizer file."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.helpers.shards import image_dir, jpeg, png, shard, wds_samples
from vlmdata.errors import ConfigError


@pytest.fixture
def images(tmp_path):
    return image_dir(tmp_path)


def test_every_bad_input_is_skipped_and_counted(tmp_path, images):
    d, files = images
    (d / "trunc.png").write_bytes(png(30, 30)[:-30])          # cut inside IDAT (without IEND alone it decodes)
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
    from tests.helpers.shards import tar_tree

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
