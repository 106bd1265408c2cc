"""Helpers for the decode tests: a gen_raw corpus's images with their header sizes."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image


def corpus_images(root: Path, limit: int | None = None) -> tuple[list[bytes], list[tuple[int, int]]]:
    """Encoded images of a gen_raw corpus in sample order, with (width, height) read from the header."""
    data, sizes = [], []
    for line in (root / "data.jsonl").read_text().splitlines():
        rec = json.loads(line)
        paths = rec.get("images") or ([rec["image"]] if "image" in rec else [])
        for rel in paths:
            p = root / rel
            if not p.exists() or p.stat().st_size == 0:
                continue
            raw = p.read_bytes()
            try:
                with Image.open(io.BytesIO(raw)) as im:
                    sizes.append(im.size)
            except OSError:
                continue
            data.append(raw)
            if limit is not None and len(data) >= limit:
                return data, sizes
    return data, sizes


def truncated(jpeg: bytes) -> bytes:
    """A JPEG cut to a third of its length (header intact, scan data missing)."""
    return jpeg[: len(jpeg) // 3]


NOT_AN_IMAGE = b"<html>not an image</html>" * 20


def diff_stats(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Mean and 99th percentile of the absolute pixel difference."""
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return float(d.mean()), float(np.percentile(d, 99))


def shard_corpus(raw: Path, out: Path, per_shard: int = 40) -> Path:
    """Shard a gen_raw corpus with `vlmdata shard`'s engine (WebDataset + index); returns the dataset dir."""
    from vlmdata.ingest import ShardConfig, shard_dataset

    shard_dataset(ShardConfig(inputs=[str(raw / "data.jsonl")], output=str(out),
                              max_samples_per_shard=per_shard, workers=1))
    return out
