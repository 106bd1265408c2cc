#!/usr/bin/env python3
"""Gemma 3: vlmdata's processor-exact pixels and planner counts against transformers' own, same run.

    python tools/bench_gemma3.py [--samples 100] [--workers 2] [--pack 8] [--rounds 3] [--sizes 1000000]
                                 [--pan-and-scan] [--out bench_out/bench-gemma3.md]

Images: a gen_raw corpus (64-1,344 px JPEGs). The reference is `Gemma3ImageProcessorPil` with Gemma 3's
published settings (896 x 896, bilinear, mean/std 0.5, pan-and-scan off; with --pan-and-scan, called with
do_pan_and_scan=True and its default crop settings, against a do_pan_and_scan folder's policy: each image
then gives 1 + its crops' tiles). Rates, images per wall second
with --workers processes (fork, each a slice), median of interleaved rounds:

- decoded images (opened once as transformers' `load_image` opens them): the processor's `__call__`
  (resize, float64 rescale, float32 normalise) against the `gemma3` policy's `pixels` (the one resize a
  DataLoader worker does; the uint8 tile goes into the pack, the adapter normalises on the device), and
  the same with that normalisation on the CPU too (`clip_pixels`), so both ends hold float32 pixel_values;
- encoded bytes: `load_image` + processor against `ExactDecoder.decode` (+ normalisation);
- the planner: the `gemma3` policy's `tokens` on --sizes random (width, height) pairs, against the processor's
  `_get_num_multimodal_tokens` on the same sizes (with --pan-and-scan, which that method does not count,
  against the image processor's own `pan_and_scan` rule run on a zero-copy array of each size).

It also prints the exact path's largest difference from the processor's pixel_values (0 expected).
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

from vlmdata.decode import ExactDecoder, make_policy  # noqa: E402
from vlmdata.hf import clip_pixels  # noqa: E402
from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import corpus_images, gemma3_folder, generator_script, write_report  # noqa: E402
from vlmdata.text.families import PAN_AND_SCAN_DEFAULTS, load_family  # noqa: E402

_W: dict = {}       # read by the forked workers


def _load(b: bytes) -> Image.Image:
    from transformers.image_utils import load_image

    return load_image(Image.open(io.BytesIO(b)))


def _vlmdata(tiles: list[np.ndarray], normalise: bool) -> torch.Tensor:
    x = torch.from_numpy(np.concatenate(tiles)).permute(0, 3, 1, 2)
    if not normalise:
        return x
    proc = _W["proc"]
    return clip_pixels(x, _W["policy"].tile, proc.image_mean, proc.image_std, torch.float32)


def _step(path: str, part: list[int]) -> torch.Tensor:
    proc, policy, resample = _W["proc"], _W["policy"], int(_W["proc"].resample)
    if path == "hf processor (decoded)":
        return proc(images=[_W["opened"][j] for j in part], return_tensors="pt", **_W["call"])["pixel_values"]
    if path == "hf load_image + processor (bytes)":
        return proc(images=[_load(_W["data"][j]) for j in part], return_tensors="pt", **_W["call"])["pixel_values"]
    if path.endswith("(decoded)"):
        tiles = [policy.pixels(_W["opened"][j], resample) for j in part]
    else:
        tiles = _W["exact"].decode([_W["data"][j] for j in part], [_W["sizes"][j] for j in part], policy)
    return _vlmdata(tiles, normalise="CPU-normalised" in path)


def _work(path: str, idx: list[int]) -> int:
    torch.set_num_threads(1)
    pack, n = _W["pack"], 0
    for i in range(0, len(idx), pack):
        n += _step(path, idx[i:i + pack]).numel()
    return n


PATHS = ("hf processor (decoded)", "vlmdata exact, worker (decoded)", "vlmdata exact, CPU-normalised (decoded)",
         "hf load_image + processor (bytes)", "vlmdata exact, worker (bytes)", "vlmdata exact, CPU-normalised (bytes)")


def pixel_rates(workers: int, rounds: int, n: int) -> dict[str, float]:
    slices = [list(range(w, n, workers)) for w in range(workers)]
    times: dict[str, list[float]] = {p: [] for p in PATHS}
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pool.starmap(_work, [(p, s[:1]) for p in PATHS for s in slices])            # warm-up
        for _ in range(rounds):
            for p in PATHS:
                t0 = time.perf_counter()
                pool.starmap(_work, [(p, s) for s in slices])
                times[p].append(time.perf_counter() - t0)
    return {p: n / statistics.median(t) for p, t in times.items()}


def planner_rates(count: int, seed: int) -> dict[str, float]:
    """Token counts per second for `count` sizes: the policy (vectorised) and the processor's own rule."""
    rng = np.random.default_rng(seed)
    w, h = rng.integers(1, 8000, count), rng.integers(1, 8000, count)
    sizes = list(zip(h.tolist(), w.tolist()))
    policy = _W["policy"]
    t0 = time.perf_counter()
    ours = policy.tokens(w, h)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    if policy.pan_and_scan:
        rule, blank, call = _W["proc"].pan_and_scan, np.zeros((1, 1, 1), np.uint8), dict(_W["call"])
        call.pop("do_pan_and_scan")
        ref = [len(rule(np.broadcast_to(blank, (3, a, b)), **call)) for a, b in sizes]
        name = "hf image processor pan_and_scan"
    else:
        ref = _W["processor"]._get_num_multimodal_tokens(image_sizes=sizes)["num_image_tokens"]
        name = "hf _get_num_multimodal_tokens"
    t_ref = time.perf_counter() - t0
    assert np.array_equal(policy.crops(w, h) if policy.pan_and_scan else ours, ref)
    return {"vlmdata gemma3 policy tokens()": count / t_ours, name: count / t_ref}


def worst_difference() -> float:
    worst = 0.0
    for j, b in enumerate(_W["data"]):
        got = _vlmdata(_W["exact"].decode([b], [_W["sizes"][j]], _W["policy"]), normalise=True)
        want = _W["proc"](images=[_load(b)], return_tensors="pt", **_W["call"])["pixel_values"]
        worst = max(worst, float((got - want).abs().max()))
    return worst


def _processor(proc, folder):
    """Gemma3Processor on a small built tokenizer (only its token-count rule is timed)."""
    from transformers import AutoTokenizer, Gemma3Processor

    return Gemma3Processor(image_processor=proc, tokenizer=AutoTokenizer.from_pretrained(str(folder)))


def main(argv: list[str] | None = None) -> int:
    from transformers import Gemma3ImageProcessorPil

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100, help="gen_raw samples (about 1.4 images each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pack", type=int, default=8, help="images per call")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", type=int, default=1_000_000, help="image sizes for the planner count")
    ap.add_argument("--pan-and-scan", action="store_true", help="a do_pan_and_scan folder against the processor "
                    "called with do_pan_and_scan=True")
    ap.add_argument("--out", default="bench_out/bench-gemma3.md")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, generator_script(), str(Path(tmp) / "raw"), "--samples", str(args.samples),
                        "--seed", str(args.seed)], check=True, capture_output=True)
        data, sizes = corpus_images(Path(tmp) / "raw")
    proc = Gemma3ImageProcessorPil(size={"height": 896, "width": 896}, resample=2, image_mean=[0.5] * 3,
                                   image_std=[0.5] * 3)
    folder = gemma3_folder(Path(tempfile.mkdtemp()) / "gemma3", do_pan_and_scan=args.pan_and_scan)
    _W.update(proc=proc, policy=make_policy(load_family(str(folder)).vision.policy), pack=args.pack,
              exact=ExactDecoder(resample=2), data=data, sizes=sizes, opened=[_load(b) for b in data],
              call={"do_pan_and_scan": True, **PAN_AND_SCAN_DEFAULTS} if args.pan_and_scan else {})
    _W["processor"] = _processor(proc, folder)
    tiles = int(_W["policy"].tiles(*zip(*sizes)).sum())
    machine = f"{cpu_model()} ({os.cpu_count()} cores), load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    print(f"{len(data)} images ({tiles} tiles); {machine}")
    r = pixel_rates(args.workers, args.rounds, len(data))
    plan = planner_rates(args.sizes, args.seed)
    worst = worst_difference()
    base_d, base_b = r["hf processor (decoded)"], r["hf load_image + processor (bytes)"]
    ours_rate, ref_rate = plan.values()
    title = "Gemma 3 pan-and-scan" if args.pan_and_scan else "Gemma 3"
    lines = [f"## {title}: exact pixels and planner counts vs transformers (tools/bench_gemma3.py)", "",
             "Command: `" + " ".join(["python tools/bench_gemma3.py"] + sys.argv[1:]) + "`", "",
             f"Machine: {machine}; Python {platform.python_version()}, torch {torch.__version__}. {len(data)} gen_raw "
             f"JPEGs ({tiles} tiles), Gemma3ImageProcessorPil at 896 px bilinear"
             f"{', pan-and-scan' if args.pan_and_scan else ''}, calls of {args.pack}, {args.workers} workers, "
             f"median of {args.rounds} interleaved rounds.", "", "| path | images/s | vs the processor |", "|---|---|---|"]
    for p, v in r.items():
        lines.append(f"| {p} | {v:.1f} | x{v / (base_d if p.endswith('(decoded)') else base_b):.2f} |")
    lines += ["", f"Planner, {args.sizes:,} sizes (one process): " + "; ".join(f"{k} {v / 1e6:.3g} M images/s"
              for k, v in plan.items()) + f" (x{ours_rate / ref_rate:.1f}).",
              "", f"Exact mode's largest difference from the processor's pixel_values: {worst:.3g}."]
    text = "\n".join(lines)
    print(text)
    write_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
