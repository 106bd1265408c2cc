#!/usr/bin/env python3
"""Processor-exact pixels: vlmdata's exact path against the Hugging Face image processor, same images, one run.

    python tools/bench_exact_pixels.py [--family qwen2_vl|internvl] [--samples 100] [--workers 2] [--pack 16]
                                       [--rounds 3] [--out bench_out/bench-exact-pixels.md]

Generates a gen_raw corpus (64-1,344 px JPEGs), and measures, with the family's image processor at its own
defaults (qwen2_vl: `Qwen2VLImageProcessorPil()`: bicubic, 56^2..28^2*1280 pixels, CLIP mean/std; internvl:
InternVL3's `GotOcr2ImageProcessorPil` at 448 px, 1-12 tiles plus the thumbnail, ImageNet mean/std, called with
`crop_to_patches=True` as `InternVLProcessor` calls it):

- on the same decoded images (opened once as transformers' `load_image` does): the processor's
  `__call__` (resize, float64 rescale, float32 normalise, patchify) against vlmdata's exact path, both as
  a DataLoader worker runs it (`ExactDecoder.from_image` resize and the uint8 patch rows a pack carries;
  the adapter normalises on the device) and with the adapter's normalisation also run on the CPU;
- from the encoded bytes: `load_image` + processor against `ExactDecoder.decode` + layout + normalise;
- the deviation of the fast mode (`PillowDecoder`: draft decode, bilinear) and of the exact mode from
  the processor's `pixel_values`: max and mean absolute difference of normalised values, share of values
  that differ, PSNR of the rescaled [0, 1] images, and the fast mode's worker-side rate;
- the planner's token counts: the policy's vectorised `tokens()` for 10^6 random sizes (one process)
  against the processor's `get_number_of_image_patches` called per image.

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

from vlmdata.decode import DynamicPolicy, ExactDecoder, PillowDecoder, is_tiled, make_policy, pack_patches  # noqa: E402
from vlmdata.hf import clip_pixels, qwen_patches  # noqa: E402
from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import corpus_images, generator_script, write_report  # noqa: E402

_STATE: dict = {}     # what forked workers read: images, processor, policy
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _opened(b: bytes) -> Image.Image:
    from transformers.image_utils import load_image

    return load_image(Image.open(io.BytesIO(b)))


def _family(name: str):
    """(image processor at its defaults, the processor's call kwargs, vlmdata's image policy) of a family."""
    if name == "internvl":
        from transformers import GotOcr2ImageProcessorPil

        proc = GotOcr2ImageProcessorPil(size={"height": 448, "width": 448}, image_mean=IMAGENET_MEAN,
                                        image_std=IMAGENET_STD)
        policy = make_policy({"kind": "internvl", "tile": 448, "patch": 14, "merge": 2, "per_tile": 256,
                              "min_tiles": proc.min_patches, "max_tiles": proc.max_patches})
        return proc, {"crop_to_patches": True}, policy
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil()
    return proc, {}, DynamicPolicy(proc.patch_size, proc.merge_size, proc.size["shortest_edge"],
                                   proc.size["longest_edge"])


def _hf(images: list) -> torch.Tensor:
    return _STATE["proc"](images=images, return_tensors="pt", **_STATE["hf_kwargs"])["pixel_values"]


def _exact_decoded(image: Image.Image, size: tuple[int, int]) -> np.ndarray:
    """What ExactDecoder makes of an image already opened as `load_image` opens it."""
    policy, exact = _STATE["policy"], _STATE["exact"]
    if is_tiled(policy):
        return policy.pixels(image, int(exact.resample))
    return exact.from_image(image, *policy.target_size(*size))


def _rows(images: list[np.ndarray], normalise: bool = True) -> torch.Tensor:
    """The images as the adapter gives them to the model (normalise=False: the uint8 rows a pack carries)."""
    proc = _STATE["proc"]
    if is_tiled(_STATE["policy"]):                      # (n, S, S, 3) tiles per image -> [tiles, 3, S, S]
        tiles = torch.from_numpy(np.concatenate(images)).permute(0, 3, 1, 2)
        if not normalise:
            return tiles
        return clip_pixels(tiles, _STATE["policy"].tile, proc.image_mean, proc.image_std, torch.float32)
    rows, _, _ = pack_patches(images, proc.patch_size, proc.merge_size)
    if not normalise:
        return torch.from_numpy(rows)
    return qwen_patches(torch.from_numpy(rows), proc.patch_size, proc.temporal_patch_size, proc.image_mean,
                        proc.image_std, torch.float32)


def _run(path: str, idx: list[int]) -> int:
    """Process the images `idx` in calls of `pack` along `path`; returns the number of values (kept alive)."""
    torch.set_num_threads(1)
    policy, pack, exact = _STATE["policy"], _STATE["pack"], _STATE["exact"]
    data, sizes, opened = _STATE["data"], _STATE["sizes"], _STATE["opened"]
    total = 0
    for i in range(0, len(idx), pack):
        part = idx[i:i + pack]
        if path == "hf processor (decoded)":
            out = _hf([opened[j] for j in part])
        elif path.startswith("vlmdata exact") and path.endswith("(decoded)"):
            out = _rows([_exact_decoded(opened[j], sizes[j]) for j in part],
                        normalise=path == "vlmdata exact, CPU-normalised (decoded)")
        elif path == "hf load_image + processor (bytes)":
            out = _hf([_opened(data[j]) for j in part])
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
    if is_tiled(policy):
        std = torch.tensor(proc.image_std).view(1, 3, 1, 1)
    else:
        std = torch.tensor(proc.image_std).repeat_interleave(proc.temporal_patch_size * proc.patch_size ** 2)
    worst, abs_sum, differ, sq, count = 0.0, 0.0, 0, 0.0, 0
    for b, s in zip(data, sizes):
        got = _rows(decoder.decode([b], [s], policy))
        want = _hf([_opened(b)])
        d = (got - want).abs()
        worst = max(worst, float(d.max()))
        abs_sum += float(d.sum())
        differ += int((d > 1e-5).sum())
        sq += float((((got - want) * std) ** 2).sum())   # in rescaled [0, 1] units
        count += d.numel()
    mse = sq / count
    return {"max_abs": worst, "mean_abs": abs_sum / count, "differ": differ / count,
            "psnr_db": math.inf if mse == 0 else 10 * math.log10(1.0 / mse)}


def planner_rates(n: int = 1_000_000, baseline: int = 20_000, seed: int = 0) -> dict[str, float]:
    """Sizes per CPU second of this process (per core: on a shared host, wall time measures the neighbours): the
    policy's tokens() on n random sizes (1-8,000 px sides, log-uniform; best of 3) and the processor's
    get_number_of_image_patches per image on `baseline` of them (the same counts, checked)."""
    proc, policy = _STATE["proc"], _STATE["policy"]
    rng = np.random.default_rng(seed)
    w, h = (np.exp(rng.uniform(0, np.log(8000), n)).astype(np.int64) for _ in range(2))
    if not is_tiled(policy):
        keep = np.maximum(w, h) / np.minimum(w, h) < 200           # Qwen's processor refuses ratios of 200
        w, h = w[keep], h[keep]
    best = math.inf
    for _ in range(3):
        t0 = time.process_time()
        tokens = policy.tokens(w, h)
        best = min(best, time.process_time() - t0)
    kwargs = dict(_STATE["hf_kwargs"])
    t0 = time.process_time()
    patches = [proc.get_number_of_image_patches(int(b), int(a), kwargs) for a, b in zip(w[:baseline], h[:baseline])]
    hf = time.process_time() - t0
    per_patch = policy.per_tile if is_tiled(policy) else policy.merge ** 2
    want = np.asarray(patches) * per_patch if is_tiled(policy) else np.asarray(patches) // per_patch
    if not np.array_equal(tokens[:baseline], want):
        raise AssertionError("the policy's token counts differ from the processor's")
    return {"vlmdata tokens()": len(w) / best, "hf get_number_of_image_patches": baseline / hf}


def report(args, n: int, r: dict, dev: dict, machine: str, plan: dict) -> str:
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
             f"Images: {n} gen_raw JPEGs (64-1,344 px sides), {args.family}: {type(_STATE['proc']).__name__} "
             f"defaults{' with crop_to_patches=True' if _STATE['hf_kwargs'] else ''}, calls of "
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
    lines += ["", "Planning from stored sizes (one process, CPU time, 10^6 random sizes of 1-8,000 px sides): "
              + ", ".join(f"{k} {v / 1e6:.2f} M sizes/s" for k, v in plan.items())
              + f" (x{plan['vlmdata tokens()'] / plan['hf get_number_of_image_patches']:.0f}); the counts are equal."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=("qwen2_vl", "internvl"), default="qwen2_vl")
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
    proc, hf_kwargs, policy = _family(args.family)
    _STATE.update(proc=proc, hf_kwargs=hf_kwargs, policy=policy, pack=args.pack,
                  exact=ExactDecoder(resample=int(proc.resample)), fast=PillowDecoder(),
                  data=data, sizes=sizes, opened=[_opened(b) for b in data])
    machine = f"{cpu_model()} ({os.cpu_count()} cores)"
    print(f"{len(data)} images; {machine}")
    r = rates(args, len(data))
    for p, v in r.items():
        print(f"  {p:36s} {v:8.1f} images/s")
    dev = {"exact (default)": deviation(_STATE["exact"]), "fast (draft + bilinear)": deviation(_STATE["fast"])}
    plan = planner_rates()
    text = report(args, len(data), r, dev, machine, plan)
    print(text)
    write_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
