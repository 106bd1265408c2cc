#!/usr/bin/env python3
"""Decode throughput: DALI-CPU vs Pillow(-SIMD) (and DALI mixed on a GPU), same images, one run.

    python tools/bench_decode.py [--samples 300] [--raw DIR] [--threads 1,2] [--rounds 2]
                                 [--out bench_out/bench-decode.md] [--save-choice] [--require-gpu]

Generates a gen_raw corpus (or uses --raw), loads every image's bytes and
header size once, then decodes them all per decoder, in calls of --pack images
(as the dataset does per pack), at a fixed 336x336 policy and at dynamic
resolution (patch 14, merge 2, 56^2..448^2 pixels). Decoders take turns round
by round so machine noise hits all alike; the reported rate is the median round.
Rows: Pillow with draft mode (the product's CPU path), Pillow without draft
(stock resize), DALI-CPU per thread count, and with a CUDA GPU: DALI mixed
decode+resize (uint8) and the full GPU stage (normalise + layout, bf16).
--save-choice records the faster CPU decoder for decoder="auto" on this machine.
"""
from __future__ import annotations

import argparse
import json
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


from vlmdata.decode import PillowDecoder  # noqa: E402
from vlmdata.decode.dali import DaliCpuDecoder  # noqa: E402
from vlmdata.sysinfo import cpu_model  # noqa: E402

try:
    from vlmdata.decode import TurboDecoder  # noqa: E402  (needs simplejpeg)
except ImportError:
    TurboDecoder = None
from vlmdata.decode import DynamicPolicy, FixedPolicy  # noqa: E402
from vlmdata.testing import corpus_images, generator_script  # noqa: E402

POLICIES = {"fixed 336x336": FixedPolicy(336), "dynamic (14x2, <=448^2)": DynamicPolicy()}





def gpu_name() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0)


class GpuDecoder:
    """DALI mixed decode+resize to uint8 (`full=False`) or the whole GPU stage (`full=True`)."""

    def __init__(self, policy, full: bool, max_batch: int, threads: int):
        import torch

        from vlmdata.decode.dali import DaliGpuStage, GpuStageOptions

        self.torch = torch
        self.policy = policy
        self.full = full
        self.stage = DaliGpuStage(policy, GpuStageOptions(device="mixed", device_id=0, max_batch=max_batch,
                                                          num_threads=threads))
        if not full:   # no normalisation: uint8 HWC on the GPU
            from vlmdata.decode.dali import DaliConfig, DaliRunner

            self.stage.runner = DaliRunner(DaliConfig(device="mixed", device_id=0, max_batch=max_batch,
                                                      num_threads=threads))

    def decode(self, images, sizes, policy):
        import numpy as np

        if self.full:
            out = self.stage.decode(images, np.asarray(sizes, dtype=np.int32))
            res = [out.pixel_values] * len(images)
        else:
            from vlmdata.decode.dali import target_hw

            res = self.stage.runner.run(images, target_hw(policy, sizes), self.stage._to_torch)
        self.torch.cuda.synchronize()
        return res


def make_decoders(args, policy, gpu: bool) -> dict:
    decs = {"pillow (draft)": PillowDecoder(), "pillow (no draft)": PillowDecoder(draft=False)}
    if TurboDecoder is not None:
        decs["turbo"] = TurboDecoder()
    for t in args.threads:
        decs[f"dali-cpu ({t} thr)"] = DaliCpuDecoder(max_batch=args.pack, num_threads=t)
    if gpu:
        decs["dali-mixed uint8"] = GpuDecoder(policy, False, args.pack, args.gpu_threads)
        decs["dali-mixed stage bf16"] = GpuDecoder(policy, True, args.pack, args.gpu_threads)
    return decs


def run_decoder(dec, data, sizes, policy, pack: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    bad = 0
    for i in range(0, len(data), pack):
        out = dec.decode(data[i:i + pack], sizes[i:i + pack], policy)
        bad += sum(o is None for o in out)
    return len(data) / (time.perf_counter() - t0), bad


def bench(args, data, sizes, gpu: bool) -> dict:
    results: dict[str, dict[str, float]] = {}
    for pname, policy in POLICIES.items():
        decoders = make_decoders(args, policy, gpu)
        warm = min(len(data), args.pack)
        for dec in decoders.values():          # warm-up: builds pipelines, fills caches
            dec.decode(data[:warm], sizes[:warm], policy)
        rates: dict[str, list[float]] = {n: [] for n in decoders}
        for _ in range(args.rounds):
            for name, dec in decoders.items():
                rate, bad = run_decoder(dec, data, sizes, policy, args.pack)
                if bad:
                    raise SystemExit(f"{name} failed on {bad} images of a clean corpus")
                rates[name].append(rate)
        results[pname] = {n: statistics.median(r) for n, r in rates.items()}
        print(f"\n{pname}:")
        base = results[pname]["pillow (draft)"]
        for n, r in results[pname].items():
            print(f"  {n:24s} {r:9.1f} images/s   x{r / base:.2f} vs pillow (draft)")
    return results


def versions() -> dict:
    import nvidia.dali
    import PIL
    import torch

    return {"python": platform.python_version(), "PIL": PIL.__version__,
            "simd": ".post" in PIL.__version__, "nvidia-dali": nvidia.dali.__version__, "torch": torch.__version__}


def write_report(path: Path, args, machine: dict, vers: dict, results: dict, n_images: int) -> None:
    lines = ["# Decode benchmark (tools/bench_decode.py)", "",
             "Command: `" + " ".join(["python tools/bench_decode.py"] + sys.argv[1:]) + "`", "",
             f"Machine: {machine['cpu']} ({machine['cores']} cores){', GPU ' + machine['gpu'] if machine['gpu'] else ', no GPU'}",
             f"Versions: {', '.join(f'{k} {v}' for k, v in vers.items())}",
             f"Images: {n_images} gen_raw JPEGs (64-1344 px sides), decoded in calls of {args.pack}, "
             f"median of {args.rounds} interleaved rounds; one process.", ""]
    names = list(next(iter(results.values())))
    lines.append("| decoder | " + " | ".join(f"{p} img/s" for p in results) + " | " +
                 " | ".join(f"{p} ratio" for p in results) + " |")
    lines.append("|---" * (1 + 2 * len(results)) + "|")
    for n in names:
        rates = [f"{results[p][n]:.1f}" for p in results]
        ratios = [f"x{results[p][n] / results[p]['pillow (draft)']:.2f}" for p in results]
        lines.append(f"| {n} | " + " | ".join(rates) + " | " + " | ".join(ratios) + " |")
    lines.append("")
    lines.append("Ratios are against Pillow(-SIMD) with draft mode (`decoder=\"auto\"` uses TurboJPEG at the same DCT scales when simplejpeg is installed).")
    lines.append(f"Load average during the run: {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
                 "(a shared machine is noisy: compare ratios within one run).")
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=300, help="gen_raw samples (about 1.4 images each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--raw", type=Path, help="an existing gen_raw corpus instead of generating one")
    ap.add_argument("--pack", type=int, default=16, help="images per decode call (DALI batch size)")
    ap.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2],
                    help="DALI-CPU thread counts to measure, comma-separated")
    ap.add_argument("--gpu-threads", type=int, default=4, help="DALI CPU threads of the mixed pipeline")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("bench_out/bench-decode.md"))
    ap.add_argument("--json", type=Path, help="also write the numbers as JSON here")
    ap.add_argument("--save-choice", action="store_true", help="record the faster CPU decoder for decoder='auto'")
    ap.add_argument("--require-gpu", action="store_true", help="fail unless a CUDA GPU runs the DALI mixed path")
    args = ap.parse_args(argv)

    gpu = gpu_name()
    if args.require_gpu and not gpu:
        print("FAIL: --require-gpu but torch sees no CUDA device", file=sys.stderr)
        return 2
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "gpu": gpu}
    vers = versions()
    print(f"machine: {machine['cpu']} | {machine['cores']} cores | GPU: {gpu or 'none'}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    with tempfile.TemporaryDirectory() as tmp:
        raw = args.raw
        if raw is None:
            raw = Path(tmp) / "raw"
            subprocess.run([sys.executable, generator_script(), str(raw), "--samples", str(args.samples),
                            "--seed", str(args.seed)], check=True, capture_output=True)
        data, sizes = corpus_images(raw)
    print(f"images: {len(data)} ({sum(map(len, data)) / 1e6:.1f} MB encoded), calls of {args.pack}")
    results = bench(args, data, sizes, gpu is not None)
    write_report(args.out, args, machine, vers, results, len(data))
    print(f"\nwrote {args.out}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "versions": vers, "results": results}, indent=1))
    if args.save_choice:
        from vlmdata.decode import save_cpu_choice

        evidence = {p: r for p, r in results.items()}
        # the CPU path that is fastest in every policy measured; else the documented default order
        names = {"pillow (draft)": "pillow", "turbo": "turbo"} | {n: "dali" for n in results[next(iter(results))] if n.startswith("dali-cpu")}
        winners = {names[max((n for n in results[p] if n in names), key=results[p].get)] for p in results}
        choice = winners.pop() if len(winners) == 1 else ("turbo" if TurboDecoder is not None else "pillow")
        print(f"saved decoder='auto' CPU choice: {choice} -> {save_cpu_choice(choice, evidence)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
