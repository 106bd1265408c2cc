#!/usr/bin/env python3
"""Processor-exact pixels: vlmdata's exact path against the Hugging Face image processor, same images, one run.

    python tools/bench_exact_pixels.py [--samples 100] [--workers 2] [--pack 16] [--rounds 3]
                                       [--out bench_out/bench-exact-pixels.md]

Generates a gen_raw corpus (64-1,344 px JPEGs), and measures, with the Qwen2-VL image processor at its own
defaults (`Qwen2VLImageProcessorPil()`: bicubic, 56^2..28^2*1280 pixels, CLIP mean/std):

- on the same decoded images (opened once as transformers' `load_image` does): the processor's
  `__call__` (resize, float64 rescale, float32 normalise, patchify) against vlmdata's exact path, both as
  a DataLoader worker runs it (`ExactDecoder.from_image` resize and the uint8 patch rows a pack carries;
  the adapter normalises on the device) and with the adapter's normalisation also run on the CPU;
- from the encoded bytes: `load_image` + processor against `ExactDecoder.decode` + layout + normalise;
- the deviation of the fast mode (`PillowDecoder`: draft decode, bilinear) and of the exact mode from
  the processor's `pixel_values`: max and mean absolute difference of normalised values, share of values
  that differ, PSNR of the rescaled [0, 1] images, and the fast mode's worker-side rate.

--workers processes share the images (fork) and each takes a slice; rates are images per wall second.
Paths take turns round by round so machine noise hits them alike; the median round is reported.
"""
from __future__ import annotations

import argparse
import io
import math
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from vlmdata.decode import DynamicPolicy, ExactDecoder, PillowDecoder, pack_patches  # noqa: E402
from vlmdata.hf import qwen_patches  # noqa: E402
from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import corpus_images, generator_script, write_report  # noqa: E402

_STATE: dict = {}     # what forked workers read: images, processor, policy


def _opened(b: bytes) -> Image.Image:
    from transformers.image_utils import load_image

    return load_image(Image.open(io.BytesIO(b)))


def _rows(images: list[np.ndarray], normalise: bool = True) -> torch.Tensor:
    """The images as the adapter gives them to the model (normalise=False: the uint8 rows a pack carries)."""
    proc = _STATE["proc"]
    rows, _, _ = pack_patches(images, proc.patch_size, proc.merge_size)
    if not normalise:
        return torch.from_numpy(rows)
    return qwen_patches(torch.from_numpy(rows), proc.patch_size, proc.temporal_patch_size, proc.image_mean,
                        proc.image_std, torch.float32)


def _run(path: str, idx: list[int]) -> int:
    """Process the images `idx` in calls of `pack` along `path`; returns the number of values (kept alive)."""
    torch.set_num_threads(1)
    proc, policy, pack, exact = _STATE["proc"], _STATE["policy"], _STATE["pack"], _STATE["exact"]
    data, sizes, opened = _STATE["data"], _STATE["sizes"], _STATE["opened"]
    total = 0
    for i in range(0, len(idx), pack):
        part = idx[i:i + pack]
        if path == "hf processor (decoded)":
            out = proc(images=[opened[j] for j in part], return_tensors="pt")["pixel_values"]
        elif path.startswith("vlmdata exact") and path.endswith("(decoded)"):
            out = _rows([exact.from_image(opened[j], *policy.target_size(*sizes[j])) for j in part],
                        normalise=path == "vlmdata exact, CPU-normalised (decoded)")
        elif path == "hf load_image + processor (bytes)":
            out = proc(images=[_opened(data[j]) for j in part], return_tensors="pt")["pixel_values"]
        else:
            decoder = _STATE["fast"] if path.startswith("vlmdata fast") else exact
            out = _rows(decoder.decode([data[j] for j in part], [sizes[j] for j in part], policy),
                        normalise=path == "vlmdata exact, CPU-normalised (bytes)")
        total += out.numel()
    return total


PATHS = ("hf processor (decoded)", "vlmdata exact, worker (decoded)", "vlmdata exact, CPU-normalised (decoded)",
         "hf load_image + processor (bytes)", "vlmdata exact, worker (bytes)", "vlmdata exact, CPU-normalised (bytes)",
         "vlmdata fast, worker (bytes)")


def rates(args, n: int) -> dict[str, float]:
    slices = [list(range(w, n, args.workers)) for w in range(args.workers)]
    got: dict[str, list[float]] = {p: [] for p in PATHS}
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        for p in PATHS:                                   # warm-up
            pool.starmap(_run, [(p, s[:2]) for s in slices])
        for _ in range(args.rounds):
            for p in PATHS:
                t0 = time.perf_counter()
                pool.starmap(_run, [(p, s) for s in slices])
                got[p].append(n / (time.perf_counter() - t0))
    return {p: statistics.median(r) for p, r in got.items()}


def deviation(decoder) -> dict[str, float]:
    """Normalised pixel_values of `decoder` against the processor's, over the whole corpus."""
    proc, policy, data, sizes = _STATE["proc"], _STATE["policy"], _STATE["data"], _STATE["sizes"]
    std = torch.tensor(proc.image_std).repeat_interleave(proc.temporal_patch_size * proc.patch_size ** 2)
    worst, abs_sum, differ, sq, count = 0.0, 0.0, 0, 0.0, 0
    for b, s in zip(data, sizes):
        got = _rows(decoder.decode([b], [s], policy))
        want = proc(images=[_opened(b)], return_tensors="pt")["pixel_values"]
        d = (got - want).abs()
        worst = max(worst, float(d.max()))
        abs_sum += float(d.sum())
        differ += int((d > 1e-5).sum())
        sq += float((((got - want) * std) ** 2).sum())   # in rescaled [0, 1] units
        count += d.numel()
    mse = sq / count
    return {"max_abs": worst, "mean_abs": abs_sum / count, "differ": differ / count,
            "psnr_db": math.inf if mse == 0 else 10 * math.log10(1.0 / mse)}


def report(args, n: int, r: dict, dev: dict, machine: str) -> str:
    import PIL
    import transformers

    def ratio(kind: str) -> str:
        base = r["hf processor (decoded)" if kind == "decoded" else "hf load_image + processor (bytes)"]
        return (f"x{r[f'vlmdata exact, worker ({kind})'] / base:.2f} worker side, "
                f"x{r[f'vlmdata exact, CPU-normalised ({kind})'] / base:.2f} CPU-normalised")

    lines = ["## Processor-exact pixels vs the Hugging Face image processor (tools/bench_exact_pixels.py)", "",
             "Command: `" + " ".join(["python tools/bench_exact_pixels.py"] + sys.argv[1:]) + "`", "",
             f"Machine: {machine}; Python {platform.python_version()}, Pillow {PIL.__version__}, "
             f"transformers {transformers.__version__}, torch {torch.__version__}; load average "
             f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}.",
             f"Images: {n} gen_raw JPEGs (64-1,344 px sides), Qwen2VLImageProcessorPil() defaults, calls of "
             f"{args.pack}, {args.workers} worker processes, median of {args.rounds} interleaved rounds.", "",
             "| path | images/s |", "|---|---|"]
    lines += [f"| {p} | {v:.1f} |" for p, v in r.items()]
    lines += ["", f"Exact path / processor on decoded images: {ratio('decoded')}; from the bytes (decode included "
              f"on both sides): {ratio('bytes')}; fast mode / exact mode (worker side, bytes): "
              f"x{r['vlmdata fast, worker (bytes)'] / r['vlmdata exact, worker (bytes)']:.2f}. \"Worker\" is what a DataLoader worker does (resize, uint8 patch "
              "rows into the pack; the adapter normalises on the device); \"CPU-normalised\" adds that "
              "normalisation and the temporal repeat on the CPU, so both sides end with the same float32 "
              "`pixel_values`.", "",
              "| mode | max abs | mean abs | values differing | PSNR (rescaled) |", "|---|---|---|---|---|"]
    for mode, d in dev.items():
        lines.append(f"| {mode} | {d['max_abs']:.3g} | {d['mean_abs']:.3g} | {100 * d['differ']:.2f} % | "
                     f"{d['psnr_db']:.1f} dB |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100, help="gen_raw samples (about 1.4 images each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pack", type=int, default=16, help="images per call")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench_out/bench-exact-pixels.md")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw"
        subprocess.run([sys.executable, generator_script(), str(raw), "--samples", str(args.samples),
                        "--seed", str(args.seed)], check=True, capture_output=True)
        data, sizes = corpus_images(raw)
    proc = Qwen2VLImageProcessorPil()
    policy = DynamicPolicy(proc.patch_size, proc.merge_size, proc.size["shortest_edge"], proc.size["longest_edge"])
    _STATE.update(proc=proc, policy=policy, pack=args.pack, exact=ExactDecoder(resample=int(proc.resample)),
                  fast=PillowDecoder(),
                  data=data, sizes=sizes, opened=[_opened(b) for b in data])
    machine = f"{cpu_model()} ({os.cpu_count()} cores)"
    print(f"{len(data)} images; {machine}")
    r = rates(args, len(data))
    for p, v in r.items():
        print(f"  {p:36s} {v:8.1f} images/s")
    dev = {"exact (default)": deviation(_STATE["exact"]), "fast (draft + bilinear)": deviation(_STATE["fast"])}
    text = report(args, len(data), r, dev, machine)
    print(text)
    write_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
