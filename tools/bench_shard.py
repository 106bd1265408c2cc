#!/usr/bin/env python3
"""Benchmark `vlmdata shard` against plain-Python baselines, same corpus, same run, same workers.

(1) original bytes: vlmdata shard (validation + tokenization + sample index +
    DALI .idx + manifest) vs a plain `webdataset.ShardWriter` copy loop that
    reads the same JSONL and image files and writes them as they are.
    Target: ratio >= 1.0, like for like: vlmdata with --no-fsync (the baseline
    never fsyncs); vlmdata's durable default (fsync before every rename) is
    reported too. Both sides run on the same warm pool.
(2) `--resize-max-side 1024` (--no-fsync): vlmdata vs an img2dataset-style Pillow loop
    (full decode of every image, resize when larger than 1024, JPEG encode,
    ShardWriter). Target: ratio >= 2.0. vlmdata keeps images that already fit
    as original bytes (no decode) and decodes large JPEGs in draft mode
    (DCT-domain downscale) + `reduce`; an extra informational baseline that
    also skips images that fit shows how much each part contributes.

Both sides run on the same pool of `--workers` spawned processes (started and
warmed before any clock starts: `import webdataset` pulls in torch) over the
same job split (rows [i*n, (i+1)*n)). The page cache is warmed first.
Both downscale with the area filter (Pillow BOX, like img2dataset's
cv2.INTER_AREA) and encode JPEG quality 95.

    python tools/bench_shard.py [--samples 2000] [--workers 2] [--corpus DIR] [--md bench_out/bench-shard.md]
"""
from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import write_report  # noqa: E402


def versions() -> dict:
    import numpy
    import PIL
    import webdataset
    from PIL import features
    return {"python": platform.python_version(), "numpy": numpy.__version__, "Pillow": PIL.__version__,
            "libjpeg_turbo": features.check_feature("libjpeg_turbo"), "webdataset": webdataset.__version__}


def make_corpus(path: Path, samples: int, seed: int) -> Path:
    if (path / "data.jsonl").exists():
        return path
    from vlmdata.testing import generator_script

    gen = generator_script()
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([sys.executable, str(gen), str(tmp), "--samples", str(samples), "--seed", str(seed)], check=True)
    tmp.rename(path)
    return path


# ---------------------------------------------------------------- baselines (one job per call)

def _rows(corpus: str, start: int, count: int) -> list[dict]:
    with open(os.path.join(corpus, "data.jsonl")) as f:
        return [json.loads(line) for i, line in enumerate(f) if start <= i < start + count]


def baseline_copy(args: tuple) -> int:
    """Plain webdataset copy loop: read files, write them as they are."""
    import webdataset as wds

    corpus, out, job, start, count = args
    rows = _rows(corpus, start, count)
    n = 0
    with wds.TarWriter(os.path.join(out, f"base-{job:06d}.tar")) as sink:
        for r in rows:
            sample = {"__key__": r["id"], "json": json.dumps(r).encode()}
            try:
                for j, p in enumerate(r["images"]):
                    with open(os.path.join(corpus, p), "rb") as f:
                        sample[f"{j}.jpg"] = f.read()
            except OSError:
                continue
            sink.write(sample)
            n += 1
    return n


def _pillow_resize(data: bytes, max_side: int, skip_small: bool) -> bytes:
    from PIL import Image

    im = Image.open(io.BytesIO(data))
    if skip_small and max(im.size) <= max_side:
        return data
    im.load()  # full decode
    if im.mode != "RGB":
        im = im.convert("RGB")
    w, h = im.size
    if max(w, h) > max_side:  # area filter for downscaling, as img2dataset (cv2.INTER_AREA)
        s = max_side / max(w, h)
        im = im.resize((max(1, round(w * s)), max(1, round(h * s))), Image.BOX)
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def baseline_resize(args: tuple) -> int:
    """img2dataset-style: decode every image, resize if larger, encode, write."""
    import webdataset as wds

    corpus, out, job, start, count, max_side, skip_small = args
    rows = _rows(corpus, start, count)
    n = 0
    with wds.TarWriter(os.path.join(out, f"base-{job:06d}.tar")) as sink:
        for r in rows:
            sample = {"__key__": r["id"], "json": json.dumps(r).encode()}
            for j, p in enumerate(r["images"]):
                with open(os.path.join(corpus, p), "rb") as f:
                    sample[f"{j}.jpg"] = _pillow_resize(f.read(), max_side, skip_small)
            sink.write(sample)
            n += 1
    return n


def _warm(_: int) -> int:
    import webdataset  # noqa: F401  (imports torch: seconds, paid before any clock starts)

    from vlmdata.ingest import shard_dataset  # noqa: F401  (loads the job code the workers run)

    time.sleep(0.5)  # keep this worker busy so that every worker gets one warm-up task
    return os.getpid()


def warm_pool(workers: int) -> ProcessPoolExecutor:
    """One spawned pool for both sides, with every worker's imports done before timing."""
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    pids = set(pool.map(_warm, range(workers)))
    if len(pids) != workers:
        print(f"warning: only {len(pids)} of {workers} workers warmed", file=sys.stderr)
    return pool


def run_baseline(pool, fn, corpus: Path, total: int, per_job: int, extra: tuple = ()) -> float:
    """Time the baseline over the same jobs on the warm pool."""
    out = tempfile.mkdtemp(prefix="bench-base-", dir=corpus.parent)
    try:
        jobs = [(str(corpus), out, j, j * per_job, per_job, *extra) for j in range((total + per_job - 1) // per_job)]
        t0 = time.perf_counter()
        written = sum(pool.map(fn, jobs))
        dt = time.perf_counter() - t0
    finally:
        shutil.rmtree(out)
    assert written > 0
    return dt


def run_vlmdata(pool, corpus: Path, workers: int, per_job: int, resize: int | None,
                fsync: bool = False) -> tuple[float, dict]:
    from vlmdata.ingest import ShardConfig, shard_dataset

    out = tempfile.mkdtemp(prefix="bench-vlm-", dir=corpus.parent)
    try:
        t0 = time.perf_counter()
        m = shard_dataset(ShardConfig(inputs=[str(corpus / "data.jsonl")], output=os.path.join(out, "ds"),
                                      workers=workers, max_samples_per_shard=per_job, resize_max_side=resize,
                                      fsync=fsync),
                          executor=pool)
        dt = time.perf_counter() - t0
    finally:
        shutil.rmtree(out)
    return dt, m.stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--per-job", type=int, default=None, help="rows per job (default: samples / (4 * workers))")
    ap.add_argument("--corpus", default=None, help="existing gen_raw corpus (default: generated under /tmp)")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved repetitions; best of each side")
    ap.add_argument("--md", default=None, help="also write the results as markdown to this file")
    a = ap.parse_args()

    corpus = Path(a.corpus) if a.corpus else Path(tempfile.gettempdir()) / f"vlmdata-bench-raw-{a.samples}-{a.seed}"
    t0 = time.perf_counter()
    make_corpus(corpus, a.samples, a.seed)
    gen_s = time.perf_counter() - t0
    total = sum(1 for _ in open(corpus / "data.jsonl"))
    per_job = a.per_job or max(1, total // (4 * a.workers))
    nbytes = 0
    for p in (corpus / "images").iterdir():  # warm the page cache for both sides
        nbytes += len(p.read_bytes())
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; workers {a.workers}; {versions()}")
    print(f"corpus: {corpus} ({total} samples, {nbytes / 1e6:.0f} MB of images; generated/reused in {gen_s:.0f}s); "
          f"{per_job} rows per job")

    results = []

    def report(name: str, base_name: str, base_s: float, ours_s: float, target: float) -> None:
        ratio = base_s / ours_s
        line = (f"{name}: vlmdata {total / ours_s:.0f} samples/s ({ours_s:.2f}s) vs {base_name} "
                f"{total / base_s:.0f} samples/s ({base_s:.2f}s): ratio {ratio:.2f}x (target >= {target}x) "
                f"{'PASS' if ratio >= target else 'MISS'}")
        print(line, flush=True)
        results.append((name, base_name, total / ours_s, total / base_s, ratio, target))

    pool = warm_pool(a.workers)
    with pool:
        base, ours, durable = [], [], []
        for _ in range(a.repeat):  # interleaved; the best of each side is reported
            base.append(run_baseline(pool, baseline_copy, corpus, total, per_job))
            t, stats = run_vlmdata(pool, corpus, a.workers, per_job, None)
            ours.append(t)
            durable.append(run_vlmdata(pool, corpus, a.workers, per_job, None, fsync=True)[0])
        report("original bytes (--no-fsync, like the baseline)", "webdataset ShardWriter copy loop",
               min(base), min(ours), 1.0)
        report("original bytes (default: fsync every file)", "webdataset ShardWriter copy loop (no fsync)",
               min(base), min(durable), 1.0)
        base, ours = [], []
        for _ in range(a.repeat):
            base.append(run_baseline(pool, baseline_resize, corpus, total, per_job, (1024, False)))
            t, stats_r = run_vlmdata(pool, corpus, a.workers, per_job, 1024)
            ours.append(t)
        report("--resize-max-side 1024", "Pillow decode-resize-encode (every image)", min(base), min(ours), 2.0)
        base_skip = run_baseline(pool, baseline_resize, corpus, total, per_job, (1024, True))
    info = (f"informational: a Pillow loop that also keeps images that already fit: {total / base_skip:.0f} "
            f"samples/s; vlmdata vs it {base_skip / min(ours):.2f}x")
    print(info)
    print(f"vlmdata skipped: {stats['skipped']} (corpus has no corrupt samples)")

    if a.md:
        lines = ["# Benchmark: vlmdata shard", "",
                 f"Command: `python tools/bench_shard.py --samples {a.samples} --workers {a.workers}`", "",
                 f"Machine: {cpu_model()}, {os.cpu_count()} cores (shared, noisy); versions: {versions()}", "",
                 f"Corpus: gen_raw.py --samples {a.samples} --seed {a.seed} ({total} samples, "
                 f"{nbytes / 1e6:.0f} MB of JPEGs), {per_job} rows per job, {a.workers} worker processes on both sides.",
                 "", "| case | vlmdata samples/s | baseline | baseline samples/s | ratio | target |",
                 "|---|---|---|---|---|---|"]
        for name, bname, ours_sps, base_sps, ratio, target in results:
            lines.append(f"| {name} | {ours_sps:.0f} | {bname} | {base_sps:.0f} | {ratio:.2f}x | >= {target}x |")
        lines += ["", info, ""]
        write_report("\n".join(lines), a.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
