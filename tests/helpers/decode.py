"""Helpers for the decode tests: a generated corpus's images (vlmdata.testing.corpus_images), damaged images."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from vlmdata.testing import corpus_images  # noqa: F401  (the decode tests take it from here)


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
