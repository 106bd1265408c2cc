#!/usr/bin/env python3
"""The loader on a GPU machine: the memmap path's host-to-device rate and DALI mixed decode images/s.

    python tools/bench_gpu_loader.py [--device cuda] [--samples 600] [--workers 4] [--epochs 4]
                                     [--cache DIR] [--out bench_out/bench-gpu-loader.md]

Rows (each in this process, 2+ DataLoader workers, 336 px, whole epochs after a warm-up epoch):
  H2D copy, pinned / pageable     torch: a 256 MiB host tensor copied to the device (best of 5):
                                  what the bus gives, the ceiling of the rows below
  memmap -> device, pinned        VLMDataset on memmap shards, make_loader(pin_memory=True), each
                                  pack's pixel_values copied to the device (non_blocking, synced per pack)
  memmap -> device, shared        the same with pin_memory=False: the copy reads the pack's shared-memory
                                  buffer directly (no pinned staging copy on the host)
  tar -> DALI mixed decode        VLMDataset on tar shards with defer_decode=True: workers ship encoded
                                  JPEGs, the training process decodes and resizes them on the GPU
                                  (DaliGpuStage, nvJPEG) to bf16 pixel_values
With `--device cpu` every row runs on the CPU instead (DALI's CPU backend, a host copy): a dry run
that checks this script on a machine without a GPU (tools/gpu_check.sh with GPU_CHECK_DRY=1).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from vlmdata.decode import FixedPolicy  # noqa: E402
from vlmdata.decode.dali import DaliGpuStage, GpuStageOptions  # noqa: E402
from vlmdata.loading import DatasetOptions, VLMDataset, make_loader  # noqa: E402
from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import bench_corpus, write_report  # noqa: E402

SIZE = 336


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_rate(device: torch.device, pinned: bool, nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Bytes/s of one host-to-device copy of `nbytes` (best of `repeats`)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned and device.type == "cuda")
    host.fill_(1)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=True)
    sync(device)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        sync(device)
        best = min(best, time.perf_counter() - t)
    return nbytes / best


def loader_rate(ds, device: torch.device, workers: int, epochs: int, pin: bool, stage=None) -> dict:
    """Images/s and bytes/s delivered onto `device` over epochs 2..N of persistent workers."""
    loader = make_loader(ds, num_workers=workers, pin_memory=pin and device.type == "cuda",
                         persistent_workers=True)
    n = nbytes = 0
    t0 = None
    for epoch in range(epochs):
        if epoch == 1:
            sync(device)
            t0, n, nbytes = time.perf_counter(), 0, 0
        for batch in loader:
            if stage is not None:
                batch = stage(batch)
                px = batch["pixel_values"]
            else:
                px = batch["pixel_values"].to(device, non_blocking=True)
            sync(device)
            n += int(px.shape[0])
            nbytes += px.numel() * px.element_size() if stage is None else int(px.shape[0]) * SIZE * SIZE * 3
    sync(device)
    dt = time.perf_counter() - t0
    return {"images_per_s": n / dt, "bytes_per_s": nbytes / dt, "images": n, "seconds": dt}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--workers", type=int, default=min(8, max(2, (os.cpu_count() or 2) // 2)))
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--cache", default=os.environ.get("VLMDATA_BENCH_CACHE", "/tmp/vlmdata-bench"))
    ap.add_argument("--out", default="bench_out/bench-gpu-loader.md")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("FAIL: --device cuda but torch sees no CUDA device (use --device cpu for a dry run)", file=sys.stderr)
        return 1
    import logging

    logging.getLogger("vlmdata.loading.dataset").setLevel(logging.ERROR)   # persistent workers repeat epochs
    device = torch.device("cuda:0" if a.device == "cuda" else "cpu")
    corpus = bench_corpus(a.cache, a.samples, SIZE)
    img = SIZE * SIZE * 3
    rows = []
    for pinned in (True, False):
        r = copy_rate(device, pinned)
        rows.append((f"H2D copy of 256 MiB, {'pinned' if pinned else 'pageable'}", r / img, r))
    mm = VLMDataset(corpus.memmap, seed=0, max_tokens=8192, image_size=SIZE, rank=0, world_size=1)
    for pin in (True, False):
        r = loader_rate(mm, device, a.workers, a.epochs, pin)
        rows.append((f"memmap -> device, {'pinned (pin_memory=True)' if pin else 'shared buffer (pin_memory=False)'}",
                     r["images_per_s"], r["bytes_per_s"]))
    mixed = "mixed" if a.device == "cuda" else "cpu"
    tar = VLMDataset(corpus.wds, seed=0, max_tokens=8192, image_size=SIZE, rank=0, world_size=1,
                     options=DatasetOptions(defer_decode=True))
    stage = DaliGpuStage(FixedPolicy(SIZE), GpuStageOptions(device=mixed, device_id=0, dtype="bfloat16",
                                                            num_threads=4))
    r = loader_rate(tar, device, a.workers, a.epochs, True, stage=stage)
    rows.append((f"tar -> DALI {mixed} decode + resize (DaliGpuStage, bf16), end to end", r["images_per_s"],
                 r["bytes_per_s"]))
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "none (dry run on the CPU)"
    lines = ["# The loader on a GPU (tools/bench_gpu_loader.py)", "",
             f"Command: `python tools/bench_gpu_loader.py {' '.join(sys.argv[1:])}`",
             f"Machine: {cpu_model()}, {os.cpu_count()} cores; GPU: {name}; Python {platform.python_version()}, "
             f"torch {torch.__version__}; {a.workers} DataLoader workers; gen_raw {a.samples} samples, {SIZE} px", "",
             "| row | images/s | GB/s |", "|---|---|---|"]
    lines += [f"| {label} | {ips:.0f} | {bps / 1e9:.2f} |" for label, ips, bps in rows]
    text = "\n".join(lines)
    print(text)
    write_report(text, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
