#!/usr/bin/env python3
"""End-to-end data wait on a slow object store: VLMDataset -> DataLoader -> a training loop with a fixed step.

    python tools/bench_data_wait.py [--samples 1500] [--latency 0.1] [--bandwidth 100e6] [--step 0.15]
                                    [--workers 2] [--cache DIR] [--out bench_out/bench-data-wait.md]

The dataset (`vlmdata.testing.bench_corpus`: gen_raw samples in 50-sample tar shards) is
uploaded to moto's S3 server, which the readers reach through a proxy adding `--latency` to
every request and capping the link at `--bandwidth` bytes/s (`vlmdata.testing.SlowStore`).
A consumer iterates `make_loader(VLMDataset(s3://...), num_workers=W)` for one epoch and
sleeps `--step` seconds per pack (the GPU's step); the data wait is the time it spends
blocked in `next()`, as a fraction of the run's wall time (whole run, and without the first
pack: the cold start, which fetches the first window before anything can be trained on).

Configurations, in the same run and against the same store:
  direct    no cache: each worker reads each shard from the store when it needs it (baseline)
  cache     CacheConfig: per-worker memory tier with plan-driven prefetch, no daemon
  daemon    CacheConfig(daemon=...): a `vlmdata cache-daemon` on this node fetches each shard once,
            ahead of the plan, into its SSD directory; workers map its files
Target (issue 16): data wait < 5 % at 100 ms per request, through the daemon and without it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vlmdata.cache import CacheConfig, RetryPolicy  # noqa: E402
from vlmdata.loading import DatasetOptions, VLMDataset, make_loader  # noqa: E402
from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import BUCKET, SlowStore, bench_corpus, write_report  # noqa: E402

RETRY = RetryPolicy(attempts=4, base_delay=0.05, max_delay=0.5)


def upload_dataset(store: SlowStore, root: str, prefix: str) -> str:
    import s3fs

    fs = s3fs.S3FileSystem(**store.options(direct=True))
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    fs.put(root.rstrip("/") + "/", f"{BUCKET}/{prefix}/", recursive=True)
    return f"s3://{BUCKET}/{prefix}"


def consume(url: str, store: SlowStore, cache, args) -> dict:
    """One epoch through make_loader with a fixed step per pack; the time blocked in next()."""
    so = store.options()
    ds = VLMDataset(url, seed=0, max_tokens=8192, image_size=336, rank=0, world_size=1, decoder="auto",
                    cache=cache, options=DatasetOptions(storage_options=so, retry=RETRY))
    store.reset()
    t0 = time.perf_counter()
    it = iter(make_loader(ds, num_workers=args.workers, pin_memory=False))
    waits, images = [], 0
    while True:
        a = time.perf_counter()
        batch = next(it, None)
        waits.append(time.perf_counter() - a)
        if batch is None:
            waits.pop()                     # the end of the epoch is not a wait for data
            break
        images += int(batch["stats"]["images"])
        del batch
        time.sleep(args.step)
    total = time.perf_counter() - t0
    del it
    st = store.stats()
    first = waits[0]
    wait = sum(waits)
    return {"packs": len(waits), "images": images, "seconds": total, "wait_s": wait, "wait_fraction": wait / total,
            "first_s": first, "steady_wait_fraction": (wait - first) / (total - first),
            "max_wait_s": max(waits[1:], default=0.0), "store_gets": st["gets"], "store_bytes": st["bytes_down"]}


def start_daemon(store: SlowStore, tmp: Path, args) -> tuple[subprocess.Popen, str, Path]:
    sockdir = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp"))     # short path (AF_UNIX limit)
    sock = sockdir / "d.sock"
    cmd = [sys.executable, "-m", "vlmdata", "cache-daemon", "--cache-dir", str(tmp / "node-ssd"),
           "--disk-bytes", str(args.daemon_disk_bytes), "--socket", str(sock),
           "--prefetch-bytes", str(args.prefetch_bytes), "--storage-options", json.dumps(store.options())]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    line = proc.stdout.readline()
    if "ready" not in line:
        proc.kill()
        raise RuntimeError(f"cache daemon did not start: {line!r}")
    return proc, str(sock), sockdir


def report(results: dict, meta: dict, args) -> str:
    lines = ["# End-to-end data wait on a slow store (tools/bench_data_wait.py)", "",
             f"Command: `python tools/bench_data_wait.py {' '.join(sys.argv[1:])}`",
             f"Machine: {cpu_model()}, {os.cpu_count()} cores, load average "
             f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end (shared machine); Python "
             f"{platform.python_version()}",
             f"Store: moto S3 on 127.0.0.1 behind a proxy: {args.latency * 1000:.0f} ms per request, "
             f"{args.bandwidth / 1e6:.0f} MB/s shared link. Dataset: {meta['samples']} gen_raw samples, "
             f"{meta['shards']} tar shards, {meta['bytes'] / 2**20:.0f} MiB. {args.workers} DataLoader workers, "
             f"{args.step * 1000:.0f} ms step per pack, one epoch per configuration.", "",
             "| configuration | data wait (whole run) | without the first pack | first pack s | longest later wait s "
             "| packs | wall s | store GETs | store MiB |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {100 * r['wait_fraction']:.1f} % | {100 * r['steady_wait_fraction']:.1f} % | "
                     f"{r['first_s']:.2f} | {r['max_wait_s']:.2f} | {r['packs']} | {r['seconds']:.1f} | "
                     f"{r['store_gets']} | {r['store_bytes'] / 2**20:.0f} |")
    lines.append("")
    for name in ("cache", "daemon"):
        if name in results:
            w = results[name]["wait_fraction"]
            lines.append(f"- {name}: data wait **{100 * w:.1f} %** of the run (target < 5 %): "
                         f"**{'met' if w < 0.05 else 'NOT MET'}**")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1500)
    ap.add_argument("--latency", type=float, default=0.1, help="seconds added to every request")
    ap.add_argument("--bandwidth", type=float, default=100e6, help="bytes/s of the store's link")
    ap.add_argument("--step", type=float, default=0.15, help="the training step per pack, seconds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--configs", default="direct,cache,daemon")
    ap.add_argument("--prefetch-bytes", type=int, default=256 << 20)
    ap.add_argument("--daemon-disk-bytes", type=int, default=2 << 30)
    ap.add_argument("--cache", default=os.environ.get("VLMDATA_BENCH_CACHE", "/tmp/vlmdata-bench"))
    ap.add_argument("--out", default="bench_out/bench-data-wait.md")
    args = ap.parse_args()
    corpus = bench_corpus(args.cache, args.samples, None)
    from vlmdata.formats import Manifest

    manifest = Manifest.load(corpus.wds)
    meta = {"samples": manifest.num_samples, "shards": len(manifest.shards), "bytes": manifest.total_bytes}
    store = SlowStore(cwd=str(REPO))
    tmp = Path(tempfile.mkdtemp(prefix="bench-data-wait-"))
    results: dict[str, dict] = {}
    try:
        url = upload_dataset(store, corpus.wds, f"wds-{args.samples}")
        store.set(args.latency, args.bandwidth)
        for name in args.configs.split(","):
            daemon = None
            try:
                if name == "direct":
                    cache = None
                elif name == "cache":
                    cache = CacheConfig(memory_bytes=1 << 30, prefetch_bytes=args.prefetch_bytes, prefetch_threads=4,
                                        storage_options=store.options(), retry=RETRY)
                elif name == "daemon":
                    daemon, sock, sockdir = start_daemon(store, tmp, args)
                    cache = CacheConfig(memory_bytes=0, prefetch_bytes=0, daemon=sock, storage_options=store.options(),
                                        retry=RETRY)
                else:
                    raise SystemExit(f"unknown configuration {name!r}")
                r = consume(url, store, cache, args)
            finally:
                if daemon is not None:
                    daemon.send_signal(signal.SIGTERM)
                    daemon.wait(60)
                    shutil.rmtree(sockdir, ignore_errors=True)
            results[name] = r
            print(f"{name:7s} data wait {100 * r['wait_fraction']:5.1f} % (without the first pack "
                  f"{100 * r['steady_wait_fraction']:5.1f} %), first pack {r['first_s']:.2f} s, {r['packs']} packs in "
                  f"{r['seconds']:.1f} s, {r['store_gets']} GETs", flush=True)
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    text = report(results, meta, args)
    print("\n" + text)
    write_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
