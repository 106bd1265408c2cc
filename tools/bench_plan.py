#!/usr/bin/env python3
"""Planning a billion samples: first pack, memory per process, resume mid-epoch, planning CPU vs workers.

    python tools/bench_plan.py [--samples 1000000000] [--shard-samples 5000] [--window-shards 8]
                               [--data-dir bench_out/plan-data] [--small 10000000] [--workers-samples 5000000]

The planning columns follow gen_raw.py's distributions (0-8 images of mixed
sizes, long-tailed text) and are generated on disk in chunks of 10^7 samples,
never whole in memory: a planning.npz with the four columns the planner reads
(text_tokens, n_images, width, height; ~15 bytes per sample), kept in
--data-dir for reruns. To keep generation to minutes, 8 distinct chunks are
drawn and repeated (the epoch's shard and sample shuffles mix them anyway).
Every measurement runs in a fresh process (its own peak RSS):

* first pack at --samples: open the file, lay out the epoch,
  plan window 0; then 40 more windows, for the CPU per window and the RSS
  once planning is under way;
* resume at the middle window of the epoch, from the (window, start) anchor
  a resume state carries. At 10^9 the anchor's start is estimated from the
  mean pack count of the first windows (its true value needs every earlier
  window planned: ~20 CPU-minutes here); the work a resume does does not
  depend on that number. At --small the anchor is the true one and the
  resumed packs are checked against the packs of a planner that planned the
  whole first half;
* baseline in the same run, at --small (the old design cannot hold 10^9 in
  memory): planning columns loaded whole, as before issue 15, vs read a window at a time;
* planning CPU per node for a whole epoch at --workers-samples with 1, 2 and
  4 DataLoader-worker processes: windows shared through a PlanShare (each
  planned once) vs each worker planning every window itself (before issue 15).
  The CPU counted is everything the workers do to walk the plan: planning
  windows, plus locating each of their packs (the part that is per pack).

Targets (issue 15, at 10^9): first pack < 1 s, planning memory per process < 1 GB,
resume at a mid-epoch cursor < 2 s, planning CPU per node independent of the workers.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from vlmdata.decode import FixedPolicy
from vlmdata.formats import PlanningColumns, PlanningWriter
from vlmdata.plan import Corpus, EpochPlanner, LocalWindows, PlanOptions, PlanShare, rank_packs
from vlmdata.sysinfo import cpu_model
from vlmdata.testing import image_and_word_counts

WORD_LEN = 4.6   # mean word length of gen_raw's vocabulary, + 1 space
CHUNK_SHARDS = 2000
DISTINCT_CHUNKS = 8
POLICY = FixedPolicy(336, 14)


def machine() -> str:
    return f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, numpy {np.__version__}"


# ---- synthetic planning file, written in chunks --------------------------------------------------------
def shard_sizes(n: int, shard_samples: int) -> np.ndarray:
    n_shards = -(-n // shard_samples)
    sizes = np.full(n_shards, shard_samples, np.int64)
    sizes[-1] = n - shard_samples * (n_shards - 1)
    return sizes


def chunk_columns(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    k, words = image_and_word_counts(rng, n)
    text = (25 + k + words * (WORD_LEN + 1) + rng.normal(0, 1, n) * np.sqrt(words) * 2).astype(np.int32)
    m = int(k.sum())
    u = rng.random(m)
    w = np.where(u < 0.7, rng.integers(320, 641, m), np.where(u < 0.9, rng.integers(800, 1345, m), rng.integers(64, 321, m)))
    h = np.where(u < 0.7, rng.integers(240, 641, m), np.where(u < 0.9, rng.integers(800, 1345, m), rng.integers(64, 321, m)))
    return {"text_tokens": text, "n_images": k.astype(np.int16), "width": w.astype(np.int32), "height": h.astype(np.int32)}


def make_data(data_dir: str, n: int, shard_samples: int, seed: int = 0) -> str:
    """planning.npz + shard_images.npy for n samples in `data_dir/n-shard_samples-seed/` (made once)."""
    root = os.path.join(data_dir, f"{n}-{shard_samples}-{seed}")
    done = os.path.join(root, "shard_images.npy")
    if os.path.exists(done):
        return root
    os.makedirs(root, exist_ok=True)
    sizes = shard_sizes(n, shard_samples)
    images = np.zeros(len(sizes), np.int64)
    writer = PlanningWriter(os.path.join(root, "planning.npz"), derived=False, fsync=False)
    t0 = time.perf_counter()
    made: dict[int, dict] = {}
    for c, c0 in enumerate(range(0, len(sizes), CHUNK_SHARDS)):
        part = sizes[c0:c0 + CHUNK_SHARDS]
        key = c % DISTINCT_CHUNKS
        if key not in made:
            made[key] = chunk_columns(np.random.default_rng([seed, key]), CHUNK_SHARDS * shard_samples)
        full = made[key]
        cols = {"text_tokens": full["text_tokens"][:int(part.sum())], "n_images": full["n_images"][:int(part.sum())]}
        m = int(cols["n_images"].sum(dtype=np.int64))
        cols.update(width=full["width"][:m], height=full["height"][:m])
        writer.add_shards(part, cols["text_tokens"], cols["n_images"], cols["width"], cols["height"])
        bounds = np.concatenate([[0], np.cumsum(part)])
        per = np.add.reduceat(cols["n_images"].astype(np.int64), bounds[:-1]) if len(part) else []
        images[c0:c0 + len(part)] = per
        done_samples = int(sizes[:c0 + len(part)].sum())
        print(f"\r  generating {done_samples:,}/{n:,} samples ({time.perf_counter() - t0:.0f} s)", end="", flush=True)
    writer.commit()
    np.save(done, images)
    print()
    return root


def open_corpus(root: str, n: int, shard_samples: int, whole: bool = False) -> Corpus:
    sizes = shard_sizes(n, shard_samples)
    pc = PlanningColumns(os.path.join(root, "planning.npz"), sizes, np.load(os.path.join(root, "shard_images.npy")))
    return Corpus.build([pc.load() if whole else pc], [sizes])


# ---- measurements, each in a child process --------------------------------------------------------------
def proc_memory() -> dict:
    """Peak RSS of this process (VmHWM: ru_maxrss would carry the parent's peak across fork + exec) and
    its current anonymous / file-backed RSS."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon", "RssFile", "VmHWM")):
                name = {"VmHWM": "peak_rss"}.get(line.split(":")[0], line.split(":")[0].lower())
                out[name + "_mb"] = int(line.split()[1]) / 1024
    return out


def child(args) -> dict:
    opts = PlanOptions(max_tokens=8192, max_images=16, window_shards=args.window_shards)
    t0, c0 = time.perf_counter(), time.process_time()
    corpus = open_corpus(args.root, args.n, args.shard_samples, whole=args.child == "whole")
    if args.child in ("first", "whole"):
        p = EpochPlanner(corpus, POLICY, opts, 0, 0, store=LocalWindows())
        p.pack_samples(0)
        res = {"first_s": time.perf_counter() - t0, "first_cpu": time.process_time() - c0,
               "windows": p.num_windows, "open_rss": proc_memory()}
        c1 = time.process_time()
        k = 1
        while k <= args.windows and k < p.num_windows:
            p.plan_window(k)
            k += 1
        res["per_window_cpu"] = (time.process_time() - c1) / max(1, k - 1)
        res["mean_packs"] = float(np.mean([p.store.count(j) for j in range(k)]))
        res.update(proc_memory())
        return res
    if args.child == "resume":
        anchor = (args.anchor_window, args.anchor_start)
        p = EpochPlanner(corpus, POLICY, opts, 0, 0, store=LocalWindows(), anchor=anchor)
        first = next(rank_packs(p, args.cursor, 8, 3))            # rank 3 of 8 takes its first pack
        res = {"resume_s": time.perf_counter() - t0, "resume_cpu": time.process_time() - c0,
               "windows_planned": p.store.computed, "first_pack": first.samples.tolist()[:8]}
        res.update(proc_memory())
        return res
    raise ValueError(args.child)


def run_child(root: str, n: int, a, mode: str, **extra) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--root", root, "--n", str(n), "--shard-samples",
           str(a.shard_samples), "--window-shards", str(a.window_shards), "--windows", str(a.windows)]
    for k, v in extra.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def true_anchor(root: str, n: int, a) -> tuple[int, int, int, list[int]]:
    """(middle window, its true first pack, a cursor inside it, rank 3 of 8's first pack from there)."""
    opts = PlanOptions(max_tokens=8192, max_images=16, window_shards=a.window_shards)
    p = EpochPlanner(open_corpus(root, n, a.shard_samples), POLICY, opts, 0, 0)
    k = p.num_windows // 2
    lo, hi = p.window_range(k, learn=True)
    cursor = lo + (hi - lo) // 3
    return k, lo, cursor, next(rank_packs(p, cursor, 8, 3)).samples.tolist()[:8]


def _worker(root: str, n: int, shard_samples: int, window_shards: int, share: str | None, w: int, nw: int) -> None:
    opts = PlanOptions(max_tokens=8192, max_images=16, window_shards=window_shards)
    corpus = open_corpus(root, n, shard_samples)
    store = None if share is None else (lambda nwin: PlanShare.at(share).store("bench-e0", nwin, keep=16))
    p = EpochPlanner(corpus, POLICY, opts, 0, 0, store=store)
    for _ in rank_packs(p, 0, 1, 0, w, nw):
        pass


def epoch_cpu(root: str, n: int, a, workers: int, shared: bool) -> tuple[float, float]:
    """(CPU seconds of all worker processes, wall seconds) to walk a whole epoch with `workers` workers."""
    ctx = multiprocessing.get_context("fork")
    share = tempfile.mkdtemp(prefix="bench-plan-share-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    procs = [ctx.Process(target=_worker, args=(root, n, a.shard_samples, a.window_shards, share if shared else None,
                                                 w, workers)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"worker exited with {p.exitcode}")
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    import shutil

    shutil.rmtree(share, ignore_errors=True)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1_000_000_000)
    ap.add_argument("--shard-samples", type=int, default=5000)
    ap.add_argument("--window-shards", type=int, default=8)
    ap.add_argument("--windows", type=int, default=40, help="windows planned after the first, for CPU per window")
    ap.add_argument("--small", type=int, default=10_000_000, help="size for the baseline and the true-anchor resume")
    ap.add_argument("--workers-samples", type=int, default=2_000_000, help="size for the CPU-per-node measurement")
    ap.add_argument("--data-dir", default="bench_out/plan-data")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--root", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--anchor-window", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--anchor-start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--cursor", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a)))
        return

    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.1f} (a shared machine: CPU seconds are the "
          "fair figure, wall seconds include waiting for a core)")
    t = time.perf_counter()
    big = make_data(a.data_dir, a.samples, a.shard_samples)
    size = os.path.getsize(os.path.join(big, "planning.npz"))
    print(f"planning file: {a.samples:,} samples, {len(shard_sizes(a.samples, a.shard_samples)):,} shards, "
          f"{size / 1e9:.1f} GB on disk ({time.perf_counter() - t:.0f} s to make or find)")
    small = make_data(a.data_dir, a.small, a.shard_samples)
    rows = []

    first = run_child(big, a.samples, a, "first")
    rows.append((f"{a.samples:,}", "first pack (open + layout + window 0)", f"{first['first_s']:.2f} s wall, "
                 f"{first['first_cpu']:.2f} s CPU", "< 1 s"))
    rows.append((f"{a.samples:,}", f"peak RSS after {a.windows + 1} windows", f"{first['peak_rss_mb']:.0f} MB "
                 f"(anon {first['rssanon_mb']:.0f} MB, file-backed {first['rssfile_mb']:.0f} MB)", "< 1024 MB"))
    epoch_big = first["per_window_cpu"] * first["windows"]
    rows.append((f"{a.samples:,}", "CPU per window / whole epoch (extrapolated)",
                 f"{first['per_window_cpu'] * 1000:.0f} ms x {first['windows']:,} windows = {epoch_big / 60:.1f} CPU-min", ""))

    k = first["windows"] // 2
    est_start = int(round(k * first["mean_packs"]))
    cursor = est_start + int(first["mean_packs"] // 3)
    res_big = run_child(big, a.samples, a, "resume", anchor_window=k, anchor_start=est_start, cursor=cursor)
    rows.append((f"{a.samples:,}", f"resume at window {k:,} of {first['windows']:,} (start estimated)",
                 f"{res_big['resume_s']:.2f} s wall, {res_big['resume_cpu']:.2f} s CPU, "
                 f"{res_big['windows_planned']} windows planned, peak RSS {res_big['peak_rss_mb']:.0f} MB", "< 2 s"))

    k_s, start_s, cursor_s, expected = true_anchor(small, a.small, a)
    res_small = run_child(small, a.small, a, "resume", anchor_window=k_s, anchor_start=start_s, cursor=cursor_s)
    same = res_small["first_pack"] == expected
    rows.append((f"{a.small:,}", f"resume at window {k_s:,} (true start {start_s:,})",
                 f"{res_small['resume_s']:.2f} s wall, {res_small['windows_planned']} windows planned, "
                 f"packs {'equal' if same else 'DIFFERENT'} to a planner that planned the first half", "equal"))

    mapped = run_child(small, a.small, a, "first")
    whole = run_child(small, a.small, a, "whole")
    rows.append((f"{a.small:,}", "baseline: columns loaded whole (before)", f"first pack {whole['first_s']:.2f} s, "
                 f"peak RSS {whole['peak_rss_mb']:.0f} MB, {whole['per_window_cpu'] * 1000:.0f} ms CPU per window", ""))
    rows.append((f"{a.small:,}", "read a window at a time (now)", f"first pack {mapped['first_s']:.2f} s, peak RSS "
                 f"{mapped['peak_rss_mb']:.0f} MB (x{whole['peak_rss_mb'] / mapped['peak_rss_mb']:.1f} less), "
                 f"{mapped['per_window_cpu'] * 1000:.0f} ms CPU per window", ""))
    per_sample = (whole["peak_rss_mb"] - mapped["peak_rss_mb"]) / a.small
    rows.append((f"{a.samples:,}", "baseline extrapolated", f"~{per_sample * a.samples / 1024:.0f} GB per process "
                 "(linear in samples)", ""))

    n_w = a.workers_samples
    mid = make_data(a.data_dir, n_w, a.shard_samples)
    cpu = {}
    for workers in (1, 2, 4):
        for shared in (True, False):
            cpu[(workers, shared)] = epoch_cpu(mid, n_w, a, workers, shared)
    base = cpu[(1, True)][0]
    for workers in (1, 2, 4):
        s, o = cpu[(workers, True)], cpu[(workers, False)]
        rows.append((f"{n_w:,}", f"whole epoch, {workers} worker(s): shared windows / each worker plans all",
                     f"{s[0]:.1f} / {o[0]:.1f} CPU-s ({s[0] / base:.2f}x / {o[0] / base:.2f}x of 1 worker); "
                     f"wall {s[1]:.1f} / {o[1]:.1f} s", "shared ~1.0x"))

    print("\n| samples | measurement | result | target |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    flat = max(cpu[(w, True)][0] for w in (1, 2, 4)) / min(cpu[(w, True)][0] for w in (1, 2, 4))
    met = {"first_pack": first["first_s"] < 1, "memory": first["peak_rss_mb"] < 1024 and res_big["peak_rss_mb"] < 1024,
           "resume": res_big["resume_s"] < 2 and same, "cpu_independent_of_workers": flat < 1.3}
    print(f"\nRESULT first_pack_s={first['first_s']:.2f} peak_rss_mb={max(first['peak_rss_mb'], res_big['peak_rss_mb']):.0f} "
          f"resume_s={res_big['resume_s']:.2f} shared_cpu_spread={flat:.2f} targets_met={met}; "
          f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
