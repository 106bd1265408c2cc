#!/usr/bin/env python3
"""Idefics3 / SmolVLM: vlmdata's processor-exact tiles and planner counts against transformers, same images, one run.

    python tools/bench_idefics3.py [--family idefics3|smolvlm] [--samples 60] [--workers 2] [--rounds 3]
                                   [--sizes 1000000] [--out bench_out/bench-idefics3.md]

Generates a gen_raw corpus (64-1,344 px JPEGs), opens each image once as transformers' `load_image` does,
and measures on those decoded images, with the family's image processor at the test folder's settings
(`vlmdata.testing.idefics3_folder`: 364 px tiles from 1,456 px, Idefics3-8B's; `smolvlm_folder`: 512 px
tiles from 2,048 px, SmolVLM-256M/500M's; LANCZOS, mean/std 0.5):

- the processor's `__call__` per image (two resizes, the split, float64 rescale, float32 normalise, padding)
  against vlmdata's exact path as a DataLoader worker runs it (`Idefics3Policy.pixels`: the same resizes,
  the uint8 tiles a pack carries; the adapter normalises on the device) and with the adapter's
  normalisation also run on the CPU (both sides then end with the same float32 `pixel_values`);
- the planner: `Idefics3Policy.tokens` over --sizes random sizes (one process) against the processor's
  `_get_num_multimodal_tokens` (Idefics3) or its image processor's `get_number_of_image_patches` on 10^4.

--workers processes share the images (fork) and each takes a slice; rates are images per wall second; the
paths take turns round by round so machine noise hits them alike; the median round is reported.
"""
from __future__ import annotations

import argparse
import io
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

from vlmdata.hf import ModelSpec, make_adapter  # noqa: E402
from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import corpus_images, generator_script, idefics3_folder, smolvlm_folder, write_report  # noqa: E402

_STATE: dict = {}     # what forked workers read: images, processor, policy, adapter

PATHS = ("hf image processor", "vlmdata exact, worker", "vlmdata exact, CPU-normalised")


def _run(path: str, idx: list[int]) -> int:
    """Process the images `idx` along `path`; returns the number of values made (kept alive)."""
    torch.set_num_threads(1)
    proc, policy, adapter, opened = _STATE["proc"], _STATE["policy"], _STATE["adapter"], _STATE["opened"]
    total = 0
    for j in idx:
        if path == "hf image processor":
            out = proc(images=[[opened[j]]], return_tensors="pt")["pixel_values"]
        else:
            tiles = torch.from_numpy(policy.pixels(opened[j], _STATE["resample"])).permute(0, 3, 1, 2)
            out = adapter.normalise(tiles, torch.float32) if path.endswith("CPU-normalised") else tiles
        total += out.numel()
    return total


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


def planner_rates(args, processor) -> tuple[float, float, str]:
    """(vlmdata tokens() sizes/s, the transformers count's sizes/s, what that count is)."""
    rng = np.random.default_rng(args.seed)
    w = np.exp(rng.uniform(0, np.log(8000), args.sizes)).astype(np.int64) + 1
    h = np.exp(rng.uniform(0, np.log(8000), args.sizes)).astype(np.int64) + 1
    policy = _STATE["policy"]
    policy.tokens(w[:1000], h[:1000])
    t0 = time.perf_counter()
    policy.tokens(w, h)
    ours = args.sizes / (time.perf_counter() - t0)
    k = min(10_000, args.sizes)
    pairs = list(zip(h[:k].tolist(), w[:k].tolist()))
    t0 = time.perf_counter()
    if hasattr(processor, "_get_num_multimodal_tokens"):
        processor._get_num_multimodal_tokens(image_sizes=pairs)
        what = "Idefics3Processor._get_num_multimodal_tokens"
    else:
        for a, b in pairs:
            processor.image_processor.get_number_of_image_patches(a, b)
        what = "SmolVLMImageProcessorPil.get_number_of_image_patches (tiles only)"
    return ours, k / (time.perf_counter() - t0), what


def _processor(folder: Path, family: str):
    import json

    import transformers
    from transformers import AutoTokenizer

    images = getattr(transformers, "Idefics3ImageProcessorPil" if family == "idefics3" else
                     "SmolVLMImageProcessorPil").from_pretrained(str(folder))
    if family != "idefics3":
        return type("ImagesOnly", (), {"image_processor": images})()
    seq = json.loads((folder / "processor_config.json").read_text())["image_seq_len"]
    cls = type("Unchecked", (transformers.Idefics3Processor,),
               {"check_argument_for_proper_class": lambda self, name, arg: type(arg)})
    return cls(image_processor=images, tokenizer=AutoTokenizer.from_pretrained(str(folder)), image_seq_len=seq)


def main(argv: list[str] | None = None) -> int:
    from transformers.image_utils import load_image

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=("idefics3", "smolvlm"), default="idefics3")
    ap.add_argument("--samples", type=int, default=60, help="gen_raw samples (about 1.4 images each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", type=int, default=1_000_000, help="image sizes the planner counts")
    ap.add_argument("--out", default="bench_out/bench-idefics3.md")
    args = ap.parse_args(argv)
    folder = (idefics3_folder if args.family == "idefics3" else smolvlm_folder)()
    spec = ModelSpec.from_folder(str(folder))
    processor = _processor(folder, args.family)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw"
        subprocess.run([sys.executable, generator_script(), str(raw), "--samples", str(args.samples),
                        "--seed", str(args.seed)], check=True, capture_output=True)
        data, _ = corpus_images(raw)
    _STATE.update(proc=processor.image_processor, policy=spec.image_policy(), adapter=make_adapter(spec),
                  resample=int(processor.image_processor.resample),
                  opened=[load_image(Image.open(io.BytesIO(b))) for b in data])
    n = len(data)
    machine = f"{cpu_model()} ({os.cpu_count()} cores)"
    print(f"{n} images; {machine}")
    r = rates(args, n)
    ours, theirs, what = planner_rates(args, processor)
    base = r["hf image processor"]
    tiles = sum(int(_STATE["policy"].tiles(*im.size)) for im in _STATE["opened"])
    lines = [f"## Idefics3 / SmolVLM exact tiles and planner counts (tools/bench_idefics3.py, {args.family})", "",
             "Command: `" + " ".join(["python tools/bench_idefics3.py"] + (argv if argv is not None else sys.argv[1:]))
             + "`", "",
             f"Machine: {machine}; Python {platform.python_version()}, transformers "
             f"{__import__('transformers').__version__}; load average "
             f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}.",
             f"Images: {n} gen_raw JPEGs (64-1,344 px sides) decoded once, {tiles} tiles of "
             f"{_STATE['policy'].tile} px; {args.workers} worker processes, median of {args.rounds} rounds.", "",
             "| path | images/s | vs the processor |", "|---|---|---|"]
    lines += [f"| {p} | {v:.1f} | x{v / base:.2f} |" for p, v in r.items()]
    lines += ["", f"Planner: `Idefics3Policy.tokens` {ours / 1e6:.2f} M sizes/s (one process, {args.sizes} sizes); "
              f"{what}: {theirs / 1e3:.1f} k sizes/s (x{ours / theirs:.0f})."]
    text = "\n".join(lines)
    print(text)
    write_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
