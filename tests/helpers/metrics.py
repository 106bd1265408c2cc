"""Helpers for the metrics tests: a small sharded corpus and its ground truth, epochs through DataLoader workers."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.helpers.corpus import generate_corpus
from vlmdata.metrics import MetricSet, instrument


@dataclass
class Corpus:
    """A sharded dataset directory and what one epoch over it must deliver."""

    root: Path
    samples: int
    images: int
    shards: int


def build_sharded_corpus(tmp: Path, samples: int = 60, per_shard: int = 10, seed: int = 3) -> Corpus:
    """gen_raw.py corpus -> `vlmdata shard` (engineer A's shard_dataset) -> dataset directory."""
    from vlmdata.ingest import ShardConfig, shard_dataset

    raw = generate_corpus(tmp / "raw", samples=samples, seed=seed)
    manifest = shard_dataset(ShardConfig(inputs=[str(raw / "data.jsonl")], output=str(tmp / "ds"),
                                         max_samples_per_shard=per_shard, workers=1))
    assert manifest.num_samples == samples, manifest.stats
    return Corpus(tmp / "ds", manifest.num_samples, manifest.num_images, len(manifest.shards))


def planned_real_tokens(corpus: Corpus, policy) -> int:
    """Real tokens of one epoch from the index alone: text tokens + the policy's tokens per image."""
    with np.load(corpus.root / "planning.npz", allow_pickle=False) as z:
        text = int(z["text_tokens"].astype(np.int64).sum())
        w, h = z["width"], z["height"]
    image = int(np.asarray(policy.tokens(w, h), dtype=np.int64).sum()) if len(w) else 0
    return text + image


def registry_value(ms: MetricSet, name: str, **labels) -> float | None:
    """One sample of the registry (None if it was never set)."""
    return ms.registry.get_sample_value(name, labels)


IMAGE_SIZE = 56  # the fixed image size run_epochs' dataset uses


def run_epochs(root: Path, metrics: MetricSet, max_tokens: int, epochs: int = 2, workers: int = 3) -> dict:
    """Consume `epochs` epochs through 3 DataLoader workers; return what the consumer saw."""
    from vlmdata.loading import VLMDataset, make_loader

    ds = VLMDataset(str(root), seed=0, max_tokens=max_tokens, image_size=IMAGE_SIZE, rank=0, world_size=1,
                    decoder="pillow")
    loader = make_loader(ds, num_workers=workers)
    seen = {"batches": 0, "samples": 0, "images": 0, "real": 0, "padding": 0, "keys": Counter()}
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for batch in instrument(loader, metrics, rank=0):
            n_real = int(batch["cu_seqlens"][-1]) if batch["sample_keys"] else 0
            seen["batches"] += 1
            seen["samples"] += len(batch["sample_keys"])
            seen["images"] += int(batch["pixel_values"].shape[0]) if "pixel_values" in batch else 0
            seen["real"] += n_real
            seen["padding"] += int(batch["input_ids"].numel()) - n_real
            seen["keys"].update(batch["sample_keys"])
    return seen
