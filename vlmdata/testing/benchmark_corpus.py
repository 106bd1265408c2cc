"""The loader benchmarks' corpus: a gen_raw corpus sharded as tar (WebDataset) and memmap shards, made once.

`bench_corpus(cache, samples)` generates `gen_raw.py --samples N --seed 0` under
`cache` (or takes the first N samples of a bigger one already there: gen_raw
is sequential, so they are the same samples) and shards it with
`shard_dataset` into tar shards and, for `image_size`, into memmap shards
(images resized to S x S). Everything is cached by name; a later call with
the same arguments returns at once.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
from dataclasses import dataclass

from vlmdata.testing.corpus import generator_script

__all__ = ["BenchCorpus", "bench_corpus"]

SAMPLES_PER_SHARD = 50


@dataclass(frozen=True)
class BenchCorpus:
    """Where the corpus lives: the raw gen_raw folder, the tar dataset, the memmap dataset (or None)."""

    raw: str
    wds: str
    memmap: str | None
    samples: int


def _raw(cache: str, samples: int) -> str:
    raw = os.path.join(cache, f"genraw-llava-{samples}")
    if os.path.exists(os.path.join(raw, "data.jsonl")):
        return raw
    bigger = sorted((d for d in glob.glob(os.path.join(cache, "genraw-llava-*"))
                     if d.rsplit("-", 1)[1].isdigit() and int(d.rsplit("-", 1)[1]) > samples
                     and os.path.exists(os.path.join(d, "data.jsonl"))), key=lambda d: int(d.rsplit("-", 1)[1]))
    if bigger:
        src = bigger[0]
        print(f"corpus: the first {samples} samples of {src} (same seed, same samples)", flush=True)
        os.makedirs(raw, exist_ok=True)
        if not os.path.exists(os.path.join(raw, "images")):
            os.symlink(os.path.join(src, "images"), os.path.join(raw, "images"))
        with open(os.path.join(src, "data.jsonl")) as f:
            lines = [next(f) for _ in range(samples)]
        with open(os.path.join(raw, "data.jsonl.tmp"), "w") as f:
            f.writelines(lines)
        os.replace(os.path.join(raw, "data.jsonl.tmp"), os.path.join(raw, "data.jsonl"))
        return raw
    print(f"corpus: gen_raw.py {raw} --samples {samples} --seed 0 (once, cached)", flush=True)
    subprocess.run([sys.executable, generator_script(), raw, "--samples", str(samples), "--seed", "0"],
                   check=True, stdout=subprocess.DEVNULL)
    return raw


def _shard(raw: str, out: str, samples: int, fmt: str, image_size: int | None) -> str:
    if os.path.exists(os.path.join(out, "manifest.json")):
        return out
    from vlmdata.ingest.shard import ShardConfig, shard_dataset

    print(f"corpus: sharding {samples} samples as {fmt} -> {out} (once, cached)", flush=True)
    manifest = shard_dataset(ShardConfig(inputs=[os.path.join(raw, "data.jsonl")], input_format="jsonl", output=out,
                                         format=fmt, image_size=image_size, fsync=False, workers=2,
                                         max_samples_per_shard=SAMPLES_PER_SHARD))
    if manifest.num_samples < samples:
        raise RuntimeError(f"sharding kept {manifest.num_samples} of {samples} samples: see {out}")
    return out


def bench_corpus(cache: str, samples: int, image_size: int | None = 336) -> BenchCorpus:
    """The gen_raw corpus of `samples` samples as tar shards and (when image_size is set) memmap shards."""
    os.makedirs(cache, exist_ok=True)
    raw = _raw(cache, samples)
    wds = _shard(raw, os.path.join(cache, f"shards-wds-{samples}"), samples, "wds", None)
    mm = None
    if image_size:
        mm = _shard(raw, os.path.join(cache, f"shards-memmap{image_size}-{samples}"), samples, "memmap", image_size)
    return BenchCorpus(raw=raw, wds=wds, memmap=mm, samples=samples)
