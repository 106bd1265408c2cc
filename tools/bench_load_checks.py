#!/usr/bin/env python3
"""Cost of the load-time index checks (issue 14): loader throughput with the checks off vs on, same run.

    python tools/bench_load_checks.py [--samples 600] [--rounds 7] [--cache DIR]

What is switched: `DatasetOptions(verify_index=...)`, i.e. the member-name and size check of every tar
member read (the 512-byte header before it), the index's shard checksum against the manifest and the
index's row layout. Always on in both runs (nothing to switch): bounded reads (a shard is read with one
range request ending at its declared size + 1 byte, the same single GET as before).

The pipeline: a gen_raw LLaVA corpus sharded by `vlmdata shard` (WebDataset tars of 50 samples, indices
carrying their shard's checksum), VLMDataset(decoder="auto", 336 px, 8192-token packs) iterated for one
epoch in this process (num_workers=0, so all the work is in the timed process and its CPU time is
measurable). The two pipelines run in lockstep, batch by batch in turn (who goes first alternates), so
both meet the same machine load; the figure is the median over rounds of samples per CPU-second
(less load-dependent on a shared machine than wall time), with wall-clock rates beside it.
Also printed: the check alone per sample (MemberCheck over every sample of the shards, against reading
those samples), and the memmap bounds check per shard.
Target: the checks cost < 3 % of loader throughput.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

SIZE = 336


def prepare(cache: str, samples: int) -> str:
    """gen_raw corpus -> vlmdata shards (cached); returns the dataset root."""
    raw = os.path.join(cache, f"genraw-llava-{samples}")
    if not os.path.exists(os.path.join(raw, "data.jsonl")):
        from vlmdata.testing import generator_script

        print(f"making the corpus: gen_raw.py {raw} --samples {samples} (once, cached)", flush=True)
        subprocess.run([sys.executable, generator_script(), raw, "--samples", str(samples), "--seed", "0"], check=True)
    root = os.path.join(cache, f"shards-wds-checked-{samples}")   # written by this vlmdata: indices name their shard
    if not os.path.exists(os.path.join(root, "manifest.json")):
        from vlmdata.ingest import ShardConfig, shard_dataset

        print(f"sharding it -> {root} (once, cached)", flush=True)
        shard_dataset(ShardConfig(inputs=[os.path.join(raw, "data.jsonl")], input_format="jsonl", output=root,
                                  format="wds", max_samples_per_shard=50, workers=2))
    return root


def lockstep_epoch(root: str, flip: bool) -> dict[bool, dict]:
    """One epoch of each pipeline (checks off, checks on), advanced batch by batch in turn, so both see
    the same machine load at the same moments; CPU and wall time are summed per pipeline."""
    from vlmdata.loading import DatasetOptions, VLMDataset, make_loader

    iters, out = {}, {}
    for verify in (False, True):
        ds = VLMDataset(root, seed=0, max_tokens=8192, max_images=16, image_size=SIZE, rank=0, world_size=1,
                        decoder="auto", options=DatasetOptions(window_shards=4, verify_index=verify))
        iters[verify] = iter(make_loader(ds, num_workers=0, pin_memory=False))
        out[verify] = {"samples": 0, "skipped": 0, "wall": 0.0, "cpu": 0.0}
    order = [True, False] if flip else [False, True]
    live = set(order)
    step = 0
    while live:
        for verify in (order if step % 2 == 0 else order[::-1]):
            if verify not in live:
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            batch = next(iters[verify], None)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if batch is None:
                live.discard(verify)
                continue
            o = out[verify]
            o["wall"] += wall
            o["cpu"] += cpu
            o["samples"] += len(batch["sample_keys"])
            o["skipped"] += sum(batch["stats"]["skipped"].values())
        step += 1
    for o in out.values():
        o["per_s"], o["per_cpu_s"] = o["samples"] / o["wall"], o["samples"] / o["cpu"]
    return out


def check_alone(root: str) -> dict:
    """Seconds per sample of MemberCheck alone, and of reading the sample (read_sample), over every shard."""
    from vlmdata.formats import Manifest, MemberCheck, SampleIndex, read_sample

    manifest = Manifest.load(root)
    check_s = read_s = 0.0
    n = 0
    for info in manifest.shards:
        data = open(os.path.join(root, info.name), "rb").read()
        ix = SampleIndex.load(os.path.join(root, info.index))
        t0 = time.process_time()
        check = MemberCheck(ix, own_layout=True)
        for i in range(len(ix)):
            check(data, i)
        t1 = time.process_time()
        for i in range(len(ix)):
            read_sample(data, ix, i)
        t2 = time.process_time()
        check_s += t1 - t0
        read_s += t2 - t1
        n += len(ix)
    return {"samples": n, "check_us": 1e6 * check_s / n, "read_us": 1e6 * read_s / n}


def memmap_bounds_cost(rows: int = 5000) -> float:
    """Microseconds to bounds-check the index of a memmap shard of `rows` samples (once per shard)."""
    import numpy as np

    from vlmdata.formats import IndexBuilder, memmap_bad_rows

    b = IndexBuilder()
    for i in range(rows):
        b.add(f"k{i}", offset=i * 100, span=100, tok=(i * 100, 100), meta=(i * 50, 50), text_tokens=99,
              images=[(i, SIZE * SIZE * 3, 640, 480)])
    ix = b.build()
    best = np.inf
    for _ in range(20):
        t0 = time.perf_counter()
        memmap_bad_rows(ix, rows, rows * 100, rows * 50)
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=7, help="epochs of each pipeline, run in lockstep")
    ap.add_argument("--cache", default=os.environ.get("VLMDATA_BENCH_CACHE", "/tmp/vlmdata-bench"))
    a = ap.parse_args()
    os.makedirs(a.cache, exist_ok=True)
    root = prepare(a.cache, a.samples)
    import numpy
    import PIL
    import torch

    from vlmdata.decode import fastest_cpu_decoder
    from vlmdata.sysinfo import cpu_model

    lockstep_epoch(root, False)                               # warm-up: page cache, decoder, imports
    runs: dict[bool, list[dict]] = {False: [], True: []}
    for r in range(a.rounds):
        got = lockstep_epoch(root, flip=r % 2 == 1)
        for verify in (False, True):
            runs[verify].append(got[verify])
    off, on = runs[False], runs[True]
    assert all(x["skipped"] == 0 for x in off + on) and len({x["samples"] for x in off + on}) == 1
    cpu_off = statistics.median(x["per_cpu_s"] for x in off)
    cpu_on = statistics.median(x["per_cpu_s"] for x in on)
    wall_off = statistics.median(x["per_s"] for x in off)
    wall_on = statistics.median(x["per_s"] for x in on)
    pair = [b["per_cpu_s"] / a_["per_cpu_s"] for a_, b in zip(off, on)]
    alone = check_alone(root)
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (shared)")
    print(f"versions: Python {platform.python_version()}, torch {torch.__version__}, numpy {numpy.__version__}, "
          f"PIL {PIL.__version__}, decoder auto = {fastest_cpu_decoder()}")
    print(f"data: {root}: {off[0]['samples']} samples, {SIZE}px, 8192-token packs, num_workers=0, "
          f"{a.rounds} rounds, batch-by-batch interleaved")
    print(f"checks off: {cpu_off:.1f} samples per CPU-second (median; {wall_off:.1f} samples/s wall)")
    print(f"checks on:  {cpu_on:.1f} samples per CPU-second (median; {wall_on:.1f} samples/s wall)")
    print(f"per-round on/off ratios (CPU): {[round(x, 3) for x in pair]}")
    print(f"the check alone: {alone['check_us']:.1f} us per sample (reading the sample without decoding: "
          f"{alone['read_us']:.1f} us; a whole sample through the loader: {1e6 / cpu_on:.0f} us)")
    print(f"memmap bounds check: {memmap_bounds_cost():.0f} us per 5000-sample shard (once per shard)")
    cost = 1 - cpu_on / cpu_off
    wall_cost = 1 - wall_on / wall_off
    verdict = "met" if cost < 0.03 else "NOT MET"
    print(f"RESULT checks cost {100 * cost:.1f} % of loader throughput per CPU-second "
          f"({100 * wall_cost:.1f} % wall; {100 * alone['check_us'] * cpu_on / 1e6:.2f} % by the check's own "
          f"time); target < 3 %: {verdict}")


if __name__ == "__main__":
    main()
