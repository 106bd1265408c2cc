#!/usr/bin/env python3
"""Loader throughput at 336 px with 2 DataLoader workers, against two webdataset baselines, with peak memory.

    python tools/bench_loader.py [--samples 1500] [--workers 2] [--rounds 3] [--epochs 8]
                                 [--cache DIR] [--out bench_out/bench-loader.md]

Pipelines, each run in a fresh process, on one gen_raw corpus (`vlmdata.testing.bench_corpus`:
`--samples` samples as 50-sample tar shards and as memmap shards of 336 px images):

  stock    webdataset + stock Pillow + DataLoader: each JPEG decoded at full size, resized to 336 x 336
           (BILINEAR), made a uint8 CHW tensor, one sample per DataLoader item. It runs in a venv of
           its own (`.bench-stock` in the repository, made on first use: python -m venv, then
           `pip install webdataset pillow torch==<this torch> numpy`), so its Pillow is stock Pillow.
  tuned    the same script in this venv (Pillow-SIMD) with `img.draft("RGB", (336, 336))`: what a
           user gets without vlmdata by installing Pillow-SIMD and turning on DCT-scaled decode.
  tar      VLMDataset on the tar shards (decoder="auto") + make_loader.
  memmap   VLMDataset on the memmap shards (pre-resized pixels, no decode) + make_loader; packs read whole
           (`loading.memmap_pack`: pixels pread straight into the pack's buffer).
  memmap-sample  the same, each pack read sample by sample (`VLMDataset.memmap_pack_reads = False`): the
           path before issue 24, for the before/after in the same run.

Each round runs every pipeline once, in an order rotated from round to round (the machine is
shared: interleaving spreads its noise over all of them). Per run:
  epoch     images/s over one whole epoch: from building the dataset to its last pack (worker
            start-up included; interpreter start and imports excluded, the same for all)
  steady    images/s after the first pack; for memmap, over epochs 2..`--epochs` of persistent
            workers (one epoch of memmap takes a fraction of a second), with the CPU per image of the
            workers and of the main process over those epochs
  peak PSS  of the run's process tree (main + workers), sampled every 50 ms from this process;
            pages of a mapped file or of shared memory are split between the processes mapping them
  CPU       seconds of the whole tree (rusage), for images per CPU-second
Also measured, right after each memmap run: this machine's memcpy rate (best of 5 copies of 256 MiB on
one core), as 336 x 336 x 3 images/s; the steady-state target compares the two of the same round.

Targets (issue 16): tar >= 3.0x stock (epoch images/s) in the worse round; memmap >= 10x stock and
>= 5x tuned over a whole epoch (worse round), >= 25 % of the memcpy rate in steady state, peak PSS
<= 1.2x stock's.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SIZE = 336
STOCK_VENV = REPO / ".bench-stock"
PIPELINES = ("stock", "tuned", "tar", "memmap", "memmap-sample")
MEMMAP = ("memmap", "memmap-sample")


# ---- the runs (each in its own process) -------------------------------------------------------
def _tree_cpu() -> tuple[float, float]:
    """CPU seconds so far of this process and of its live children (the DataLoader workers)."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    workers = 0.0
    for c in me.children(recursive=True):
        try:
            ct = c.cpu_times()
            workers += ct.user + ct.system
        except psutil.Error:
            pass
    return t.user + t.system, workers


def _timed(loader_factory, count, epochs: int = 1) -> dict:
    """Whole first epoch (factory call included) and the steady rate after the first pack; with several
    epochs (persistent workers) also the steady state's CPU per image, main process and workers apart."""
    t0 = time.perf_counter()
    loader = loader_factory()
    n, first_t, first_n, t_epoch1, n_epoch1 = 0, None, 0, None, 0
    for e in range(epochs):
        for item in loader:
            n += count(item)
            if first_t is None:
                first_t, first_n = time.perf_counter(), n
        if e == 0:
            t_epoch1, n_epoch1 = time.perf_counter(), n
            cpu_epoch1 = _tree_cpu()
    t_end = time.perf_counter()
    cpu_end = _tree_cpu()
    if epochs > 1:
        steady = (n - n_epoch1) / (t_end - t_epoch1)
    else:
        steady = (n - first_n) / (t_end - first_t)
    return {"images": n_epoch1, "total_images": n, "epoch_s": t_epoch1 - t0, "epoch_images_per_s": n_epoch1 / (t_epoch1 - t0),
            "first_s": first_t - t0, "steady_images_per_s": steady, "steady_images": n - n_epoch1 if epochs > 1
            else n - first_n, "steady_main_cpu_s": cpu_end[0] - cpu_epoch1[0],
            "steady_worker_cpu_s": cpu_end[1] - cpu_epoch1[1]}


def run_webdataset(root: str, workers: int, draft: bool) -> dict:
    import glob

    import PIL
    import torch
    import webdataset as wds
    from PIL import Image
    from torch.utils.data import DataLoader

    def to_tensors(sample: dict) -> dict:
        images = []
        for key in sorted(k for k in sample if k.endswith(".jpg")):
            img = Image.open(io.BytesIO(sample[key]))
            if draft:
                img.draft("RGB", (SIZE, SIZE))
            img = img.convert("RGB").resize((SIZE, SIZE), Image.BILINEAR)
            images.append(torch.from_numpy(np.asarray(img)).permute(2, 0, 1).contiguous())
        tokens = np.load(io.BytesIO(sample["tok.npy"]))
        return {"images": images, "input_ids": torch.from_numpy(tokens[0].astype(np.int64))}

    shards = sorted(glob.glob(os.path.join(root, "*.tar")))

    def make():
        ds = wds.WebDataset(shards, shardshuffle=False, empty_check=False).map(to_tensors)
        return DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=lambda x: x)

    out = _timed(make, lambda s: len(s["images"]))
    return out | {"pil": PIL.__version__}


def run_vlmdata(root: str, workers: int, epochs: int, pack_reads: bool = True) -> dict:
    import logging

    import PIL

    sys.path.insert(0, str(REPO))
    from vlmdata.loading import VLMDataset, make_loader

    logging.getLogger("vlmdata.loading.dataset").setLevel(logging.ERROR)   # persistent workers repeat epochs

    def make():
        ds = VLMDataset(root, seed=0, max_tokens=8192, max_images=16, image_size=SIZE, rank=0, world_size=1,
                        decoder="auto")
        ds.memmap_pack_reads = pack_reads
        return make_loader(ds, num_workers=workers, pin_memory=False, persistent_workers=epochs > 1 and workers > 0)

    out = _timed(make, lambda b: int(b["stats"]["images"]), epochs)
    return out | {"pil": PIL.__version__}


# ---- the driver ----------------------------------------------------------------------------------
class TreeMemory:
    """Peak PSS (sum over a process and its descendants), sampled on a thread."""

    def __init__(self, pid: int, interval: float = 0.05):
        self.pid, self.interval = pid, interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _tree(self) -> list[int]:
        from vlmdata.tune import child_pids

        out, todo = [], [self.pid]
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(child_pids(p))
        return out

    def _loop(self) -> None:
        from vlmdata.tune import read_proc_mem

        while not self._stop.wait(self.interval):
            total = 0
            for p in self._tree():
                m = read_proc_mem(p)
                total += m.pss if m is not None else 0
            self.peak = max(self.peak, total)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_one(kind: str, python: str, root: str, args) -> dict:
    cmd = [python, str(Path(__file__).resolve()), "--run", kind, "--root", root, "--workers", str(args.workers),
           "--epochs", str(args.epochs if kind in MEMMAP else 1)]
    env = dict(os.environ)
    if kind == "stock":
        env.pop("PYTHONPATH", None)            # nothing of this venv (Pillow-SIMD, vlmdata) on its path
    cpu0 = _children_cpu()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    with TreeMemory(proc.pid) as mem:
        out, err = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} run failed ({proc.returncode}):\n{err[-3000:]}")
    res = json.loads(out.strip().splitlines()[-1])
    res["peak_pss"] = mem.peak
    res["cpu_s"] = _children_cpu() - cpu0
    return res


def ensure_stock_venv(path: Path) -> str:
    """The stock-Pillow venv's python, made on first use."""
    import torch

    py = path / "bin" / "python"
    probe = "import PIL, webdataset, torch, numpy, psutil; print(PIL.__version__)"     # psutil: the CPU clock
    ok = py.exists() and subprocess.run([str(py), "-c", probe], capture_output=True, text=True).returncode == 0
    if not ok:
        print(f"making the stock baseline's venv {path} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "webdataset", "pillow",
                        f"torch=={torch.__version__.split('+')[0]}", "numpy", "psutil"], check=True)
    version = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    if ".post" in version:
        raise SystemExit(f"{path} has Pillow-SIMD ({version}); the stock baseline needs stock Pillow: delete it")
    return str(py)


def memcpy_rate(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Bytes/s of one core copying a large buffer (best of `repeats`)."""
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return nbytes / best


def _fmt_ratio(values: list[float]) -> str:
    return " / ".join(f"{v:.2f}x" for v in values)


def report(results: dict, order: list[list[str]], args, versions: dict, corpus) -> str:
    import torch

    from vlmdata.sysinfo import cpu_model

    img_bytes = SIZE * SIZE * 3
    lines = ["# Loader benchmark (tools/bench_loader.py)", "",
             f"Command: `python tools/bench_loader.py {' '.join(sys.argv[1:])}`",
             f"Machine: {cpu_model()}, {os.cpu_count()} cores, load average "
             f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end (shared machine)",
             f"Versions: Python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}, "
             f"webdataset {versions['webdataset']}, stock Pillow {versions['stock']}, Pillow-SIMD "
             f"{versions['simd']}, simplejpeg {versions['simplejpeg']}",
             f"Corpus: gen_raw --samples {corpus.samples} --seed 0: {results['stock'][0]['images']} images; "
             f"{args.workers} DataLoader workers; {SIZE} x {SIZE} uint8 pixels", "",
             f"Rounds (order rotated): {'; '.join(', '.join(r) for r in order)}", "",
             "| pipeline | epoch images/s (rounds) | median | steady images/s (median) | peak PSS MiB (max) | "
             "images per CPU-s (median) |", "|---|---|---|---|---|---|"]
    med = {}
    for kind in PIPELINES:
        runs = results[kind]
        ep = [r["epoch_images_per_s"] for r in runs]
        med[kind] = statistics.median(ep)
        per_cpu = statistics.median(r["total_images"] / r["cpu_s"] for r in runs)
        lines.append(f"| {kind} | {' / '.join(f'{x:.0f}' for x in ep)} | {med[kind]:.0f} | "
                     f"{statistics.median(r['steady_images_per_s'] for r in runs):.0f} | "
                     f"{max(r['peak_pss'] for r in runs) / 2**20:.0f} | {per_cpu:.0f} |")
    n = len(results["stock"])
    ratio = {k: [results[k][i]["epoch_images_per_s"] / results[b][i]["epoch_images_per_s"] for i in range(n)]
             for k, b in (("tar", "stock"), ("memmap", "stock"))}
    ratio_t = {k: [results[k][i]["epoch_images_per_s"] / results["tuned"][i]["epoch_images_per_s"] for i in range(n)]
               for k in ("tar", "memmap")}
    tuned_r = [results["tuned"][i]["epoch_images_per_s"] / results["stock"][i]["epoch_images_per_s"] for i in range(n)]
    steady = statistics.median(r["steady_images_per_s"] for r in results["memmap"])
    memcpy = statistics.median(r["memcpy"] for r in results["memmap"])
    of_memcpy = [r["steady_images_per_s"] * img_bytes / r["memcpy"] for r in results["memmap"]]
    pss = {k: max(r["peak_pss"] for r in results[k]) for k in PIPELINES}
    pss_round = [results["memmap"][i]["peak_pss"] / results["stock"][i]["peak_pss"] for i in range(n)]

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT MET"

    cpu_rate = {k: statistics.median(r["total_images"] / r["cpu_s"] for r in results[k]) for k in PIPELINES}
    lines += ["", "Ratios per round (epoch images/s, same round):", "",
              f"- images per CPU-second of the process tree (load-independent), median: tar / stock "
              f"{cpu_rate['tar'] / cpu_rate['stock']:.2f}x, memmap / stock {cpu_rate['memmap'] / cpu_rate['stock']:.2f}x,"
              f" tar / tuned {cpu_rate['tar'] / cpu_rate['tuned']:.2f}x, memmap / tuned "
              f"{cpu_rate['memmap'] / cpu_rate['tuned']:.2f}x",
              f"- tuned / stock: {_fmt_ratio(tuned_r)}",
              f"- **tar / stock: {_fmt_ratio(ratio['tar'])}** -> worse round {min(ratio['tar']):.2f}x, target >= 3.0x: "
              f"**{verdict(min(ratio['tar']) >= 3.0)}**; tar / tuned: {_fmt_ratio(ratio_t['tar'])}",
              f"- **memmap / stock: {_fmt_ratio(ratio['memmap'])}** -> worse round {min(ratio['memmap']):.2f}x, "
              f"target >= 10x: **{verdict(min(ratio['memmap']) >= 10)}**",
              f"- **memmap / tuned: {_fmt_ratio(ratio_t['memmap'])}** -> worse round {min(ratio_t['memmap']):.2f}x, "
              f"target >= 5x: **{verdict(min(ratio_t['memmap']) >= 5)}**",
              f"- memmap steady state: median {steady:.0f} images/s = {steady * img_bytes / 1e9:.2f} GB/s; this "
              f"machine's memcpy, measured after each memmap run: median {memcpy / 1e9:.1f} GB/s = "
              f"{memcpy / img_bytes:.0f} images/s; steady state / memcpy per round "
              f"**{' / '.join(f'{x:.1%}' for x in of_memcpy)}** -> worse round {min(of_memcpy):.1%}, target >= 25 %: "
              f"**{verdict(min(of_memcpy) >= 0.25)}**",
              f"- peak PSS of the process tree: memmap {pss['memmap'] / 2**20:.0f} MiB, tar {pss['tar'] / 2**20:.0f} MiB, "
              f"stock {pss['stock'] / 2**20:.0f} MiB, tuned {pss['tuned'] / 2**20:.0f} MiB; memmap / stock per round "
              f"{' / '.join(f'{x:.2f}x' for x in pss_round)}, target <= 1.2x: **{verdict(max(pss_round) <= 1.2)}**"]
    lines += ["", "memmap packs read whole (`loading.memmap_pack`, the default) vs sample by sample (`memmap-sample`: "
              "`VLMDataset.memmap_pack_reads = False`, the path before issue 24), steady state (epochs 2.."
              f"{args.epochs} of persistent workers):", "",
              "| memmap reads | steady images/s (per round) | of memcpy (per round) | worker CPU ms per image | "
              "main CPU ms per image | peak PSS MiB (max) | PSS / stock (per round) |", "|---|---|---|---|---|---|---|"]
    for kind in MEMMAP:
        runs = results[kind]
        rates = " / ".join(f"{r['steady_images_per_s']:.0f}" for r in runs)
        of_copy = " / ".join(f"{r['steady_images_per_s'] * img_bytes / r['memcpy']:.1%}" for r in runs)
        worker_ms = statistics.median(1e3 * r["steady_worker_cpu_s"] / r["steady_images"] for r in runs)
        main_ms = statistics.median(1e3 * r["steady_main_cpu_s"] / r["steady_images"] for r in runs)
        of_stock = " / ".join(f"{r['peak_pss'] / st['peak_pss']:.2f}x" for r, st in zip(runs, results["stock"]))
        lines.append(f"| {kind} | {rates} | {of_copy} | {worker_ms:.3f} | {main_ms:.3f} | "
                     f"{max(r['peak_pss'] for r in runs) / 2**20:.0f} | {of_stock} |")
    if "inproc" in results:
        r = results["inproc"]
        lines.append(f"- informational: memmap in the main process (0 workers), steady state "
                     f"{statistics.median(x['steady_images_per_s'] for x in r):.0f} images/s")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1500)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=8, help="memmap: epochs of persistent workers (steady state)")
    ap.add_argument("--cache", default=os.environ.get("VLMDATA_BENCH_CACHE", "/tmp/vlmdata-bench"))
    ap.add_argument("--stock-venv", default=str(STOCK_VENV), help="the stock baseline's venv (made when missing)")
    ap.add_argument("--only", default=",".join(PIPELINES), help=argparse.SUPPRESS)
    ap.add_argument("--out", default="bench_out/bench-loader.md")
    ap.add_argument("--run", choices=PIPELINES + ("inproc",), help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run:
        if a.run in ("stock", "tuned"):
            res = run_webdataset(a.root, a.workers, draft=a.run == "tuned")
        else:
            res = run_vlmdata(a.root, 0 if a.run == "inproc" else a.workers, a.epochs, a.run != "memmap-sample")
        print(json.dumps(res))
        return 0

    sys.path.insert(0, str(REPO))
    from vlmdata.testing import bench_corpus, write_report

    corpus = bench_corpus(a.cache, a.samples, SIZE)
    stock_py = ensure_stock_venv(Path(a.stock_venv))
    roots = {"stock": corpus.wds, "tuned": corpus.wds, "tar": corpus.wds, "memmap": corpus.memmap,
             "memmap-sample": corpus.memmap, "inproc": corpus.memmap}
    pythons = {k: sys.executable for k in roots} | {"stock": stock_py}
    kinds = [k for k in PIPELINES if k in a.only.split(",")]
    results: dict[str, list[dict]] = {k: [] for k in kinds}
    order = []
    for r in range(a.rounds):
        ks = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
        order.append(ks)
        for k in ks:
            res = run_one(k, pythons[k], roots[k], a)
            if k in MEMMAP:                    # this machine's memcpy rate now, next to the memmap run
                res["memcpy"] = memcpy_rate()
                print(f"memcpy: {res['memcpy'] / 1e9:.1f} GB/s = {res['memcpy'] / (SIZE * SIZE * 3):.0f} images/s "
                      f"of {SIZE} px", flush=True)
            results[k].append(res)
            print(f"round {r + 1} {k:7s} epoch {res['epoch_images_per_s']:8.1f} images/s  steady "
                  f"{res['steady_images_per_s']:8.1f}  peak PSS {res['peak_pss'] / 2**20:6.0f} MiB  "
                  f"CPU {res['cpu_s']:.1f} s  (PIL {res['pil']})", flush=True)
    results["inproc"] = [run_one("inproc", sys.executable, corpus.memmap, a)]
    import PIL
    import simplejpeg
    import webdataset

    versions = {"webdataset": getattr(webdataset, "__version__", "?"), "stock": results["stock"][0]["pil"],
                "simd": PIL.__version__, "simplejpeg": simplejpeg.__version__}
    text = report(results, order, a, versions, corpus)
    print("\n" + text)
    write_report(text, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
