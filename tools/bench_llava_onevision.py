#!/usr/bin/env python3
"""LLaVA-OneVision: vlmdata's exact anyres tiles against LlavaOnevisionImageProcessorPil, and the planner's count.

    python tools/bench_llava_onevision.py [--samples 100] [--workers 2] [--rounds 3] [--sizes 1000000]
                                          [--out bench_out/bench-llava-onevision.md]

Pixels: a gen_raw corpus (64-1,344 px JPEGs), each image a sample's only image (the anyres path: best
pinpoint, aspect-preserving resize, padding, 384 px tiles plus the base image), with the published
checkpoints' image processor settings (transformers' defaults, mean/std 0.5). On the same decoded
images (opened once as `load_image` opens them): the processor's `__call__` against the policy's
`pixels` (the uint8 tiles a DataLoader worker puts in the pack; the adapter normalises them on the
device), and with the normalisation run on the CPU as well; from the encoded bytes: `load_image` +
processor against `ExactDecoder.decode` and the fast mode (`PillowDecoder`: bilinear). --workers
processes (fork) each take a slice; the paths take turns round by round; the median round's images
per wall second is reported, with each path's ratio to the processor; then each mode's deviation from
the processor's `pixel_values` (max, mean, PSNR).

Planning: `tokens(width, height)` of --sizes random sizes (1-5,000 px) in one call, images per second
of wall and of CPU time (the machine is shared), against the processor's own count
(`_get_num_multimodal_tokens`) on 20,000 of them.
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

from vlmdata.decode import ExactDecoder, PillowDecoder, make_policy  # noqa: E402
from vlmdata.hf import clip_pixels  # noqa: E402
from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import corpus_images, generator_script, write_report  # noqa: E402

_STATE: dict = {}        # what the forked workers read


def _opened(data: bytes) -> Image.Image:
    from transformers.image_utils import load_image

    return load_image(Image.open(io.BytesIO(data)))


def _normalised(tiles: np.ndarray) -> torch.Tensor:
    ip, policy = _STATE["proc"], _STATE["policy"]
    return clip_pixels(torch.from_numpy(np.array(tiles)).permute(0, 3, 1, 2), policy.tile, ip.image_mean,
                       ip.image_std, torch.float32)


def _one(path: str, j: int):
    """One image along `path` (its output, kept until the next)."""
    ip, policy = _STATE["proc"], _STATE["policy"]
    if path == "hf processor (decoded)":
        return ip(images=[_STATE["opened"][j]], return_tensors="pt")["pixel_values"]
    if path == "hf load_image + processor (bytes)":
        return ip(images=[_opened(_STATE["data"][j])], return_tensors="pt")["pixel_values"]
    if path.endswith("(bytes)"):
        decoder = _STATE["fast" if path.startswith("vlmdata fast") else "exact"]
        tiles = decoder.decode([_STATE["data"][j]], [_STATE["sizes"][j]], policy, [1])[0]
    else:
        tiles = policy.pixels(_STATE["opened"][j], int(ip.resample))
    return _normalised(tiles) if "CPU-normalised" in path else tiles


def _work(path: str, idx: list[int]) -> int:
    torch.set_num_threads(1)
    return sum(int(np.prod(_one(path, j).shape)) for j in idx)


PATHS = ("hf processor (decoded)", "vlmdata exact, worker (decoded)", "vlmdata exact, CPU-normalised (decoded)",
         "hf load_image + processor (bytes)", "vlmdata exact, worker (bytes)", "vlmdata fast, worker (bytes)")


def pixel_rates(workers: int, rounds: int, n: int) -> dict[str, float]:
    """Median images per wall second of each path, paths interleaved round by round."""
    slices = [list(range(w, n, workers)) for w in range(workers)]
    seen: dict[str, list[float]] = {p: [] for p in PATHS}
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pool.starmap(_work, [(p, s[:1]) for p in PATHS for s in slices])          # warm-up
        for _ in range(rounds):
            for p in PATHS:
                t0 = time.perf_counter()
                pool.starmap(_work, [(p, s) for s in slices])
                seen[p].append(n / (time.perf_counter() - t0))
    return {p: statistics.median(v) for p, v in seen.items()}


def deviation(path: str, n: int) -> dict[str, float]:
    """`path`'s normalised pixel_values against the processor's over the corpus: max and mean |difference|,
    PSNR of the [0, 1] images."""
    worst, total, sq, count = 0.0, 0.0, 0.0, 0
    for j in range(n):
        got, want = _normalised(_one(path, j)), _one("hf load_image + processor (bytes)", j)[0]
        d = (got - want).abs()
        worst, total, count = max(worst, float(d.max())), total + float(d.sum()), count + d.numel()
        sq += float(((d * torch.tensor(_STATE["proc"].image_std).view(1, 3, 1, 1)) ** 2).sum())
    mse = sq / count
    return {"max": worst, "mean": total / count, "psnr": math.inf if mse == 0 else 10 * math.log10(1 / mse)}


def planner_rates(policy, processor, n: int) -> dict[str, float]:
    """tokens() of n random sizes: images/s (wall, CPU), and the processor's own count's images/s."""
    rng = np.random.default_rng(0)
    w, h = rng.integers(1, 5001, n), rng.integers(1, 5001, n)
    policy.tokens(w[:1000], h[:1000])
    wall, cpu = time.perf_counter(), time.process_time()
    got = policy.tokens(w, h)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    k = min(n, 20_000)
    t0 = time.perf_counter()
    want = processor._get_num_multimodal_tokens(image_sizes=list(zip(h[:k].tolist(), w[:k].tolist())))
    ref = time.perf_counter() - t0
    if not np.array_equal(got[:k], want["num_image_tokens"]):
        raise SystemExit("the planner's counts differ from the processor's")
    return {"wall": n / wall, "cpu": n / cpu, "processor": k / ref}


def processor_of(image_processor):
    """LlavaOnevisionProcessor (only its counting is used) on a word-level tokenizer with <image>."""
    from tokenizers import Tokenizer, models
    from transformers import LlavaOnevisionProcessor, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.add_special_tokens(["<image>", "<video>"])
    cls = type("Processor", (LlavaOnevisionProcessor,), {"check_argument_for_proper_class": lambda s, n, a: type(a)})
    return cls(image_processor=image_processor, tokenizer=PreTrainedTokenizerFast(tokenizer_object=tok),
               video_processor=None, num_image_tokens=729, vision_feature_select_strategy="full")


def report(args, n: int, tiles: int, r: dict, dev: dict, plan: dict, machine: str) -> str:
    import PIL
    import transformers

    base = {"decoded": r["hf processor (decoded)"], "bytes": r["hf load_image + processor (bytes)"]}
    lines = ["## LLaVA-OneVision exact tiles vs LlavaOnevisionImageProcessorPil (tools/bench_llava_onevision.py)", "",
             "Command: `" + " ".join(["python tools/bench_llava_onevision.py"] + sys.argv[1:]) + "`", "",
             f"Machine: {machine}; Python {platform.python_version()}, Pillow {PIL.__version__}, transformers "
             f"{transformers.__version__}, torch {torch.__version__}; load average "
             f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}.",
             f"Images: {n} gen_raw JPEGs (64-1,344 px), each alone in its sample (anyres: {tiles} tiles of 384 px "
             f"in all), {args.workers} worker processes, median of {args.rounds} interleaved rounds.", "",
             "| path | images/s | / processor |", "|---|---|---|"]
    for p, v in r.items():
        lines.append(f"| {p} | {v:.1f} | x{v / base['bytes' if p.endswith('(bytes)') else 'decoded']:.2f} |")
    lines += ["", "| mode | max abs | mean abs | PSNR (rescaled) |", "|---|---|---|---|"]
    lines += [f"| {m} | {d['max']:.3g} | {d['mean']:.3g} | {d['psnr']:.1f} dB |" for m, d in dev.items()]
    lines += ["",
              f"Planning: tokens() of {args.sizes:,} random sizes: {plan['wall'] / 1e6:.2f} M images/s wall, "
              f"{plan['cpu'] / 1e6:.2f} M images/s of CPU time (one core); the processor's own count "
              f"(_get_num_multimodal_tokens): {plan['processor'] / 1e3:.1f} k images/s "
              f"(x{plan['wall'] / plan['processor']:.0f})."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from transformers import LlavaOnevisionImageProcessorPil

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100, help="gen_raw samples (about 1.4 images each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", type=int, default=1_000_000, help="sizes the planner counts")
    ap.add_argument("--out", default="bench_out/bench-llava-onevision.md")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw"
        subprocess.run([sys.executable, generator_script(), str(raw), "--samples", str(args.samples),
                        "--seed", str(args.seed)], check=True, capture_output=True)
        data, sizes = corpus_images(raw)
    ip = LlavaOnevisionImageProcessorPil(image_mean=[0.5] * 3, image_std=[0.5] * 3)
    policy = make_policy({"kind": "llava_onevision", "pinpoints": ip.image_grid_pinpoints, "image_token_id": 1,
                          "pad_color": [int(m * 255) for m in ip.image_mean]})
    _STATE.update(proc=ip, policy=policy, exact=ExactDecoder(resample=int(ip.resample)), fast=PillowDecoder(),
                  data=data, sizes=sizes, opened=[_opened(b) for b in data])
    machine = f"{cpu_model()} ({os.cpu_count()} cores)"
    tiles = int(policy.tiles(np.asarray([w for w, _ in sizes]), np.asarray([h for _, h in sizes])).sum())
    print(f"{len(data)} images, {tiles} tiles; {machine}")
    plan = planner_rates(policy, processor_of(ip), args.sizes)
    r = pixel_rates(args.workers, args.rounds, len(data))
    dev = {mode: deviation(f"vlmdata {mode}, worker (bytes)", len(data)) for mode in ("exact", "fast")}
    text = report(args, len(data), tiles, r, dev, plan, machine)
    print(text)
    write_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
