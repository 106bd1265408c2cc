#!/usr/bin/env python3
"""Loader throughput: 336x336 images/s delivered to the training process with 2 DataLoader workers.

    python tools/bench_loader.py [--samples 600] [--workers 2] [--cache DIR]

vlmdata: VLMDataset (decoder="auto": TurboJPEG DCT-scaled decode via simplejpeg + Pillow-SIMD
resize when simplejpeg is installed, else Pillow-SIMD draft mode; packing) + make_loader.
Baseline, what users run today, on the same tar shards: webdataset + STOCK
Pillow + DataLoader decoding each image at full size, resizing it to
336x336 and making a uint8 tensor. Stock Pillow is installed once into a
separate directory (`pip install --target <cache>/stock-pillow Pillow`) and
the baseline runs in a subprocess with PYTHONPATH pointing there.
Also reported: the single-core decode rate (decode + resize to 336) of the path
vlmdata used, of Pillow-SIMD draft mode and of a full-size decode, and the second
target, 70 % of the used path's rate times the number of workers.
Targets (issue 3): >= 3x the baseline, >= 0.7 x single-core rate x workers.
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

SIZE = 336


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, Python {platform.python_version()}"


def _version(module: str) -> str:
    try:
        return str(__import__(module).__version__)
    except ImportError:
        return "absent"


# ---- the baseline (runs in a subprocess with stock Pillow first on sys.path) -----------------------
def baseline(shards: list[str], workers: int) -> dict:
    import PIL
    import torch
    import webdataset as wds
    from PIL import Image
    from torch.utils.data import DataLoader

    def to_tensors(sample: dict) -> dict:
        images = []
        for key in sorted(k for k in sample if k.endswith(".jpg")):
            img = Image.open(io.BytesIO(sample[key])).convert("RGB").resize((SIZE, SIZE), Image.BILINEAR)
            images.append(torch.from_numpy(np.asarray(img)).permute(2, 0, 1).contiguous())
        tokens = np.load(io.BytesIO(sample["tok.npy"]))
        return {"images": images, "input_ids": torch.from_numpy(tokens[0].astype(np.int64))}

    ds = wds.WebDataset(shards, shardshuffle=False, empty_check=False).map(to_tensors)
    loader = DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=lambda x: x)
    return _measure(loader, lambda s: len(s["images"])) | {"pil": PIL.__version__}


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (the DataLoader workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _measure(loader, count) -> dict:
    """Images/s after the first item (worker start-up excluded), and CPU seconds per image of the
    whole run (workers included: a load-independent figure on a shared machine)."""
    c0 = _cpu()
    it = iter(loader)
    first = next(it)
    n0 = count(first)
    t0 = time.perf_counter()
    n = 0
    for item in it:
        n += count(item)
    dt = time.perf_counter() - t0
    del it
    cpu = _cpu() - c0
    return {"images": n, "seconds": dt, "images_per_s": n / dt if dt else 0.0, "first_images": n0,
            "images_per_cpu_s": (n + n0) / cpu if cpu else 0.0}


# ---- vlmdata ---------------------------------------------------------------------------------------
def vlmdata_run(root: str, workers: int) -> dict:
    import PIL

    from vlmdata.loading import DatasetOptions, VLMDataset, make_loader

    ds = VLMDataset(root, seed=0, max_tokens=8192, max_images=16, image_size=SIZE, rank=0, world_size=1,
                    decoder="auto", options=DatasetOptions(window_shards=4))
    loader = make_loader(ds, num_workers=workers, pin_memory=False)
    return _measure(loader, lambda b: int(b["pixel_values"].shape[0])) | {"pil": PIL.__version__}


def single_core_rate(root: str, limit: int = 400, rounds: int = 3) -> dict:
    """Decode + resize to 336x336 of the corpus' JPEGs, in this process (one core): the path
    decoder="auto" uses, Pillow-SIMD draft mode and a full-size decode; best of `rounds`
    interleaved rounds each (the machine is shared)."""
    from vlmdata.decode import PillowDecoder, fastest_cpu_decoder, make_decoder
    from vlmdata.formats import Manifest, SampleIndex, member_bytes

    manifest = Manifest.load(root)
    images = []
    for info in manifest.shards:
        data = open(os.path.join(root, info.name), "rb").read()
        ix = SampleIndex.load(os.path.join(root, info.index))
        images += [bytes(member_bytes(data, int(o), int(s))) for o, s in zip(ix.img_offset, ix.img_size)]
        if len(images) >= limit:
            break
    images = images[:limit]
    used = f"auto = {fastest_cpu_decoder()}"
    decoders = {used: make_decoder("auto"), "pillow (draft)": PillowDecoder(),
                "pillow (no draft, full-size decode)": PillowDecoder(draft=False)}
    rates = {label: (0.0, 0.0) for label in decoders}
    for _ in range(rounds):
        for label, dec in decoders.items():
            dec.decode_one(images[0], SIZE, SIZE)
            t0, c0 = time.perf_counter(), time.process_time()
            for data in images:
                dec.decode_one(data, SIZE, SIZE)
            got = (len(images) / (time.perf_counter() - t0), len(images) / (time.process_time() - c0))
            rates[label] = (max(rates[label][0], got[0]), max(rates[label][1], got[1]))
    wall, cpu = rates[used]
    return {"images": len(images), "decoder": used, "images_per_s_wall": wall, "images_per_s_cpu": cpu,
            "filters": rates}


# ---- set-up ----------------------------------------------------------------------------------------
def prepare(cache: str, samples: int) -> tuple[str, str]:
    raw = os.path.join(cache, f"genraw-llava-{samples}")
    bigger = [d for d in glob.glob(os.path.join(cache, "genraw-llava-*"))
              if d.rsplit("-", 1)[1].isdigit() and int(d.rsplit("-", 1)[1]) > samples
              and os.path.isdir(os.path.join(d, "images")) and os.path.exists(os.path.join(d, "data.jsonl"))]
    if not os.path.exists(os.path.join(raw, "data.jsonl")) and bigger:
        # gen_raw.py is sequential: the first N samples of a bigger corpus with the same seed are gen_raw(N)
        src = bigger[0]
        print(f"corpus: first {samples} samples of {src} (same seed, same samples)")
        os.makedirs(raw, exist_ok=True)
        if not os.path.exists(os.path.join(raw, "images")):
            os.symlink(os.path.join(src, "images"), os.path.join(raw, "images"))
        with open(os.path.join(src, "data.jsonl")) as f:
            lines = [next(f) for _ in range(samples)]
        with open(os.path.join(raw, "data.jsonl.tmp"), "w") as f:
            f.writelines(lines)
        os.replace(os.path.join(raw, "data.jsonl.tmp"), os.path.join(raw, "data.jsonl"))
    if not os.path.exists(os.path.join(raw, "data.jsonl")):
        from vlmdata.testing import require_gen_raw

        print(f"making the corpus: gen_raw.py {raw} --samples {samples} (once, cached)")
        subprocess.run([sys.executable, require_gen_raw(), raw, "--samples", str(samples), "--seed", "0"], check=True)
    root = os.path.join(cache, f"shards-wds-{samples}")
    if not os.path.exists(os.path.join(root, "manifest.json")):
        from vlmdata.ingest import ShardConfig, shard_dataset

        print(f"sharding it with vlmdata.ingest.shard_dataset -> {root} (once, cached)")
        manifest = shard_dataset(ShardConfig(inputs=[os.path.join(raw, "data.jsonl")], input_format="jsonl",
                                             output=root, format="wds", max_samples_per_shard=50, workers=2))
        if manifest.num_samples < samples:
            raise SystemExit(f"sharding gave {manifest.num_samples} samples of {samples}: see {root}")
    return raw, root


def stock_pillow(cache: str) -> str:
    target = os.path.join(cache, "stock-pillow")
    if not glob.glob(os.path.join(target, "PIL", "__init__.py")):
        print(f"installing stock Pillow into {target} (once)")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--target", target, "--no-deps", "Pillow"], check=True)
    return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", default=os.environ.get("VLMDATA_BENCH_CACHE", "/tmp/vlmdata-bench"))
    ap.add_argument("--repeats", type=int, default=2, help="alternate runs of each pipeline; best kept")
    ap.add_argument("--baseline-worker", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.baseline_worker is not None:
        print(json.dumps(baseline(a.baseline_worker, a.workers)))
        return
    os.makedirs(a.cache, exist_ok=True)
    _, root = prepare(a.cache, a.samples)
    stock = stock_pillow(a.cache)
    import PIL
    import torch
    import webdataset

    shards = sorted(glob.glob(os.path.join(root, "*.tar")))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([stock, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    cmd = [sys.executable, os.path.abspath(__file__), "--workers", str(a.workers), "--baseline-worker", *shards]
    ours, base = [], []
    for _ in range(a.repeats):
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        base.append(json.loads(out.strip().splitlines()[-1]))
        ours.append(vlmdata_run(root, a.workers))
    single = single_core_rate(root)
    b = max(base, key=lambda r: r["images_per_s"])
    o = max(ours, key=lambda r: r["images_per_s"])
    target2 = 0.7 * single["images_per_s_cpu"] * a.workers
    print(f"machine: {machine()}")
    print(f"versions: torch {torch.__version__}, webdataset {getattr(webdataset, '__version__', '?')}, "
          f"vlmdata PIL {PIL.__version__} (Pillow-SIMD: {'.post' in PIL.__version__}), "
          f"simplejpeg {_version('simplejpeg')}, baseline PIL {b['pil']}")
    print(f"data: {len(shards)} tar shards of {root}, {a.samples} gen_raw samples; {a.workers} DataLoader workers; "
          f"images resized to {SIZE}x{SIZE} uint8")
    print(f"baseline (webdataset + stock Pillow + DataLoader): {b['images_per_s']:.1f} images/s "
          f"(runs: {[round(r['images_per_s'], 1) for r in base]}); "
          f"{max(r['images_per_cpu_s'] for r in base):.1f} images per CPU-second")
    print(f"vlmdata (VLMDataset + make_loader):                 {o['images_per_s']:.1f} images/s "
          f"(runs: {[round(r['images_per_s'], 1) for r in ours]}); "
          f"{max(r['images_per_cpu_s'] for r in ours):.1f} images per CPU-second")
    print(f"single-core decode+resize of the path used ({single['decoder']}): {single['images_per_s_cpu']:.1f} "
          f"images per CPU-second ({single['images_per_s_wall']:.1f} wall); 70% x {a.workers} workers = "
          f"{target2:.1f} images/s")
    cpu_ratio = max(r["images_per_cpu_s"] for r in ours) / max(r["images_per_cpu_s"] for r in base)
    print("  single-core decode paths (images per CPU-second / wall): " + ", ".join(
        f"{k} {v[1]:.0f} / {v[0]:.0f}" for k, v in single["filters"].items()))
    print(f"RESULT ratio {o['images_per_s'] / b['images_per_s']:.2f}x images/s, {cpu_ratio:.2f}x images per "
          f"CPU-second (target >= 3x); vlmdata / (0.7 x single-core x workers) = "
          f"{o['images_per_s'] / target2:.2f} wall, "
          f"{max(r['images_per_cpu_s'] for r in ours) / (0.7 * single['images_per_s_cpu']):.2f} per CPU-second "
          "(target >= 1)")


if __name__ == "__main__":
    main()
