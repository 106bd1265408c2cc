"""Helpers for the sharding tests: input images, running `shard_dataset`, reading its output back."""
from __future__ import annotations

import glob
import io
import json
import os
from pathlib import Path

import numpy as np
from PIL import Image

from vlmdata.formats import Manifest
from vlmdata.ingest import ShardConfig, shard_dataset
from vlmdata.text import ByteTokenizer, encode_conversation

# what gen_raw.py calls each corruption -> the reason vlmdata counts it under
GEN_RAW_REASONS = {"truncated": "truncated_image", "empty": "empty_file", "missing": "missing_file",
                   "not_jpeg": "not_an_image", "bad_text": "bad_text"}


def shard(inputs, out, **kw) -> Manifest:
    """shard_dataset with test defaults (inline workers unless given)."""
    kw.setdefault("workers", 0)
    if not isinstance(inputs, list):
        inputs = [inputs]
    return shard_dataset(ShardConfig(inputs=[str(i) for i in inputs], output=str(out), **kw))


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def wds_samples(out: Path) -> dict[str, dict]:
    """Every sample of the output's tars, read by the `webdataset` library (no decoding)."""
    import webdataset as wds

    urls = sorted(glob.glob(str(out / "*.tar")))
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    out_samples = {}
    for s in ds:
        assert s["__key__"] not in out_samples, f"duplicate key {s['__key__']}"
        out_samples[s["__key__"]] = s
    return out_samples


def expected_tokens(rec: dict) -> np.ndarray:
    """The tokens vlmdata must write for a gen_raw LLaVA record (byte tokenizer)."""
    roles = {"human": "user", "gpt": "assistant"}
    turns = [(roles[t["from"]], t["value"]) for t in rec["conversations"]]
    return encode_conversation(ByteTokenizer(), turns, len(rec["images"]))


def load_npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def tar_tree(out: Path) -> dict[str, bytes]:
    """Shard data/index files of a dataset dir (name -> bytes), for byte-identical comparisons."""
    files = {}
    for p in sorted(os.listdir(out)):
        if p.startswith("shard-"):
            files[p] = (out / p).read_bytes()
    return files


def jpeg(w=40, h=30, color=(200, 10, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def png(w=20, h=24) -> bytes:
    buf = io.BytesIO()
    Image.new("RGBA", (w, h), (0, 100, 200, 128)).save(buf, format="PNG")
    return buf.getvalue()


def image_dir(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """tmp_path/imgs with a.jpg, b.png and c.jpg; returns the directory and name -> bytes."""
    d = tmp_path / "imgs"
    d.mkdir()
    files = {"a.jpg": jpeg(40, 30), "b.png": png(20, 24), "c.jpg": jpeg(64, 48, (0, 200, 0))}
    for name, data in files.items():
        (d / name).write_bytes(data)
    return d, files


def stored_members(out: Path) -> dict[str, dict[str, bytes]]:
    """Every sample's members except its source record (`json`): images and tokens, by key."""
    return {key: {m: v for m, v in s.items() if m not in ("json", "__url__", "__local_path__")}
            for key, s in wds_samples(out).items()}
