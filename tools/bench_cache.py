#!/usr/bin/env python
"""Benchmark of the shard cache against a real S3 API with injected latency and bandwidth limits.

A helper process runs moto's S3 server on 127.0.0.1 behind an asyncio TCP proxy that delays every
HTTP request by a fixed latency and throttles the bytes it sends back (one shared link), and
counts requests and bytes: the "object store" as the cache sees it. Three measurements:

1. Remote fetches, Belady next to LRU, on the same window-shuffle trace over 3 epochs, with a
   cache of 25 / 50 / 75 % of the dataset (target at 50 %: Belady <= 0.75x LRU). The offline
   simulator's counts are printed next to the measured ones.
2. With 100 ms per request: the data-wait fraction of a consumer loop (get the shard of each
   sample, then a simulated step) with prefetch on, next to prefetch off (target < 5 %).
3. Four reader processes on one node through `vlmdata cache-daemon`: bytes fetched from the store
   divided by the dataset bytes (target 1.0x), next to four readers without the daemon (4x).

Usage: .venv/bin/python tools/bench_cache.py [--quick] [--out bench_out/bench-cache.md]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vlmdata.cache import CacheConfig, RetryPolicy, ShardCache, ShardRef, TieredFetcher  # noqa: E402
from vlmdata.cache.daemon import connect, recv_msg, send_msg  # noqa: E402
from vlmdata.testing import BUCKET, SlowStore, simulate, upload_random, window_shuffle_trace, write_report  # noqa: E402

# ---------------------------------------------------------------------------------------------
# the store: moto + latency/bandwidth proxy, in its own process, controlled over stdin/stdout
# ---------------------------------------------------------------------------------------------
RETRY = RetryPolicy(attempts=4, base_delay=0.05, max_delay=0.5)


# ---------------------------------------------------------------------------------------------
# 1. Belady vs LRU
# ---------------------------------------------------------------------------------------------
@dataclass
class Sizes:
    policy_shards: int = 200
    policy_shard_bytes: int = 16 << 10
    policy_window: int = 8
    prefetch_shards: int = 40
    prefetch_shard_bytes: int = 1 << 20
    prefetch_epochs: int = 3
    reads_per_shard: int = 8
    step_seconds: float = 0.020
    daemon_shards: int = 24
    daemon_shard_bytes: int = 1 << 20
    readers: int = 4


def bench_policy(store: SlowStore, sz: Sizes) -> list[dict]:
    store.set(0.002, 0)
    refs = upload_random(store, "policy", sz.policy_shards, sz.policy_shard_bytes, seed=1)
    trace = window_shuffle_trace(sz.policy_shards, sz.policy_window, epochs=3, seed=0, reads_per_shard=1)
    seq = [refs[i] for i in trace]
    rows = []
    for frac in (0.25, 0.50, 0.75):
        cap = int(sz.policy_shards * frac)
        row = {"cache": f"{int(frac * 100)}%", "capacity_shards": cap, "accesses": len(seq)}
        for policy in ("belady", "lru"):
            cfg = CacheConfig(memory_bytes=cap * sz.policy_shard_bytes, policy=policy, prefetch_bytes=0,
                              storage_options=store.options(), retry=RETRY)
            fetcher = TieredFetcher(ShardCache(cfg))
            store.reset()
            fetcher.plan_ahead(seq)
            for r in seq:
                fetcher.get(r)
            st = store.stats()
            row[policy] = fetcher.stats()["remote_fetches"]
            row[f"{policy}_store_gets"] = st["gets"]
            row[f"{policy}_sim"] = simulate(trace, cap, policy)
            fetcher.close()
        row["ratio"] = row["belady"] / row["lru"]
        rows.append(row)
        print(f"  cache {row['cache']}: belady {row['belady']} (sim {row['belady_sim']}), lru {row['lru']} "
              f"(sim {row['lru_sim']}), ratio {row['ratio']:.3f}", flush=True)
    return rows


# ---------------------------------------------------------------------------------------------
# 2. prefetch and data wait
# ---------------------------------------------------------------------------------------------
def consume(fetcher, seq: list[ShardRef], reads_per_shard: int, step_seconds: float, seed: int) -> dict:
    """A training loop: each step reads one sample (its shard via the fetcher), then computes."""
    rng = random.Random(seed)
    wait, first = 0.0, None
    t0 = time.perf_counter()
    steps = 0
    fetcher.plan_ahead(seq)
    for ref in seq:
        for _ in range(reads_per_shard):
            a = time.perf_counter()
            data = fetcher.get(ref)
            w = time.perf_counter() - a
            wait += w
            first = w if first is None else first
            _ = data[rng.randrange(len(data))]  # touch the bytes
            time.sleep(step_seconds)  # the simulated training step (GPU compute)
            steps += 1
    total = time.perf_counter() - t0
    return {"steps": steps, "seconds": total, "wait_seconds": wait, "wait_fraction": wait / total,
            "first_wait_seconds": first, "steady_wait_fraction": (wait - first) / (total - first)}


def bench_prefetch(store: SlowStore, sz: Sizes, tmp: Path) -> dict:
    refs = upload_random(store, "prefetch", sz.prefetch_shards, sz.prefetch_shard_bytes, seed=2)
    store.set(0.100, 200e6)
    trace = window_shuffle_trace(sz.prefetch_shards, 4, epochs=sz.prefetch_epochs, seed=3, reads_per_shard=1)
    seq = [refs[i] for i in trace]
    out = {"latency_s": 0.100, "bandwidth_Bps": 200e6, "shards": sz.prefetch_shards,
           "shard_bytes": sz.prefetch_shard_bytes, "epochs": sz.prefetch_epochs, "step_seconds": sz.step_seconds}
    for name, prefetch in (("prefetch_off", 0), ("prefetch_on", 12 * sz.prefetch_shard_bytes)):
        d = tmp / f"ssd-{name}"
        cfg = CacheConfig(memory_bytes=8 * sz.prefetch_shard_bytes, disk_dir=str(d),
                          disk_bytes=16 * sz.prefetch_shard_bytes, prefetch_bytes=prefetch, prefetch_threads=6,
                          storage_options=store.options(), retry=RETRY)
        fetcher = TieredFetcher(ShardCache(cfg, disk_dir=str(d)))
        store.reset()
        res = consume(fetcher, seq, sz.reads_per_shard, sz.step_seconds, seed=4)
        res["cache"] = fetcher.stats()
        res["store_gets"] = store.stats()["gets"]
        fetcher.close()
        out[name] = res
        print(f"  {name}: data-wait {100 * res['wait_fraction']:.1f}% of {res['seconds']:.1f}s "
              f"(steady state {100 * res['steady_wait_fraction']:.1f}%, first get {res['first_wait_seconds']:.2f}s) "
              f"({res['steps']} steps, {res['store_gets']} store GETs)", flush=True)
    store.set(0, 0)
    return out


def bench_dataset(store: SlowStore, tmp: Path, samples: int = 240) -> dict:
    """Informational: the same prefetch comparison end to end, through VLMDataset + make_loader."""
    try:
        import s3fs

        from vlmdata.ingest import ShardConfig, shard_dataset
        from vlmdata.loading import DatasetOptions, VLMDataset, make_loader
    except ImportError as exc:
        return {"skipped": f"VLMDataset or the sharder is not importable: {exc}"}
    raw, ds_dir = tmp / "raw", tmp / "vlm"
    from vlmdata.testing import generator_script

    gen = generator_script()
    subprocess.run([sys.executable, str(gen), str(raw), "--samples", str(samples), "--seed", "0"], check=True,
                   capture_output=True)
    m = shard_dataset(ShardConfig(inputs=[str(raw / "data.jsonl")], input_format="jsonl", output=str(ds_dir),
                                  max_samples_per_shard=20, workers=1))
    fs = s3fs.S3FileSystem(**store.options(direct=True))
    fs.put(str(ds_dir) + "/", f"{BUCKET}/vlm/", recursive=True)
    store.set(0.100, 200e6)
    out = {"shards": len(m.shards), "bytes": m.total_bytes, "samples": m.num_samples, "workers": 2, "step_seconds": 0.15}
    for name, prefetch in (("prefetch_off", 0), ("prefetch_on", 64 << 20)):
        so = store.options()
        cache = CacheConfig(memory_bytes=32 << 20, prefetch_bytes=prefetch, prefetch_threads=4, storage_options=so,
                            retry=RETRY)
        ds = VLMDataset(f"s3://{BUCKET}/vlm", seed=0, max_tokens=4096, image_size=112, rank=0, world_size=1,
                        decoder="pillow", cache=cache, options=DatasetOptions(storage_options=so, window_shards=4))
        store.reset()
        t0 = time.perf_counter()
        wait, first, steps = 0.0, None, 0
        it = iter(make_loader(ds, num_workers=2, pin_memory=False))
        while True:
            a = time.perf_counter()
            batch = next(it, None)
            w = time.perf_counter() - a
            if batch is None:
                break
            wait += w
            first = w if first is None else first
            steps += 1
            time.sleep(out["step_seconds"])
        total = time.perf_counter() - t0
        st = store.stats()
        out[name] = {"steps": steps, "seconds": total, "wait_fraction": wait / total, "first_wait_seconds": first,
                     "steady_wait_fraction": (wait - first) / (total - first), "store_gets": st["gets"]}
        r = out[name]
        print(f"  VLMDataset {name}: data-wait {100 * r['wait_fraction']:.1f}% (steady "
              f"{100 * r['steady_wait_fraction']:.1f}%) of {total:.1f}s, {steps} packs, {st['gets']} store GETs",
              flush=True)
    store.set(0, 0)
    return out


# ---------------------------------------------------------------------------------------------
# 3. four readers on one node
# ---------------------------------------------------------------------------------------------
def reader_process(cfg: CacheConfig, refs: list[ShardRef], seed: int, out: mp.Queue) -> None:
    fetcher = cfg.open()
    trace = window_shuffle_trace(len(refs), 4, epochs=1, seed=seed, reads_per_shard=1)
    seq = [refs[i] for i in trace]
    fetcher.plan_ahead(seq)
    nbytes, bad = 0, 0
    for r in seq:
        data = fetcher.get(r)
        nbytes += len(data)
        bad += (zlib.crc32(data) & 0xFFFFFFFF) != r.crc32
    stats = fetcher.stats()
    fetcher.close()
    out.put({"seed": seed, "bytes_read": nbytes, "bad": bad, "stats": stats})


def run_readers(cfg: CacheConfig, refs: list[ShardRef], n: int) -> list[dict]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=reader_process, args=(cfg, refs, 100 + i, q)) for i in range(n)]
    for p in procs:
        p.start()
    results = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
    return results


def bench_daemon(store: SlowStore, sz: Sizes, tmp: Path) -> dict:
    refs = upload_random(store, "daemon", sz.daemon_shards, sz.daemon_shard_bytes, seed=5)
    dataset_bytes = sum(r.size for r in refs)
    store.set(0.020, 400e6)
    out = {"readers": sz.readers, "dataset_bytes": dataset_bytes}
    # baseline: each reader process with its own cache
    cfg = CacheConfig(memory_bytes=64 << 20, prefetch_bytes=8 * sz.daemon_shard_bytes,
                      storage_options=store.options(), retry=RETRY)
    store.reset()
    res = run_readers(cfg, refs, sz.readers)
    st = store.stats()
    out["no_daemon"] = {"store_bytes": st["bytes_down"], "store_gets": st["gets"],
                        "bytes_read": sum(r["bytes_read"] for r in res), "bad": sum(r["bad"] for r in res),
                        "ratio": st["bytes_down"] / dataset_bytes}
    # through the daemon
    sockdir = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp"))
    sock = sockdir / "d.sock"
    so = json.dumps(store.options())
    daemon = subprocess.Popen([sys.executable, "-m", "vlmdata", "cache-daemon", "--cache-dir", str(tmp / "node-ssd"),
                               "--disk-bytes", str(4 * dataset_bytes), "--socket", str(sock),
                               "--prefetch-bytes", str(8 * sz.daemon_shard_bytes), "--storage-options", so],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert "ready" in daemon.stdout.readline()
        cfg = CacheConfig(memory_bytes=0, prefetch_bytes=0, daemon=str(sock), storage_options=store.options(),
                          retry=RETRY)
        store.reset()
        res = run_readers(cfg, refs, sz.readers)
        st = store.stats()
        s = connect(str(sock), timeout=10)
        send_msg(s, {"op": "stats"})
        dstats = recv_msg(s)["stats"]
        s.close()
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
        shutil.rmtree(sockdir, ignore_errors=True)
    out["daemon"] = {"store_bytes": st["bytes_down"], "store_gets": st["gets"],
                     "bytes_read": sum(r["bytes_read"] for r in res), "bad": sum(r["bad"] for r in res),
                     "daemon_gets": sum(r["stats"]["daemon_gets"] for r in res),
                     "fallback_gets": sum(r["stats"]["fallback_gets"] for r in res),
                     "daemon_remote_bytes": dstats["remote_bytes"],
                     "ratio": st["bytes_down"] / dataset_bytes, "payload_ratio": dstats["remote_bytes"] / dataset_bytes}
    for k in ("no_daemon", "daemon"):
        r = out[k]
        print(f"  {k}: store sent {r['store_bytes'] / 1e6:.1f} MB for {r['bytes_read'] / 1e6:.1f} MB read by "
              f"{sz.readers} readers = {r['ratio']:.3f}x the dataset ({r['store_gets']} GETs, bad {r['bad']})",
              flush=True)
    store.set(0, 0)
    return out


# ---------------------------------------------------------------------------------------------
def machine() -> dict:
    import fsspec
    import moto
    import s3fs

    from vlmdata.sysinfo import cpu_model

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(), "moto": moto.__version__,
            "s3fs": s3fs.__version__, "fsspec": fsspec.__version__, "platform": platform.platform()}


def report(m: dict, policy: list[dict], pre: dict, dmn: dict, cmd: str, seconds: float) -> str:
    at50 = next(r for r in policy if r["cache"] == "50%")
    lines = [
        "# Cache benchmark (tools/bench_cache.py)", "",
        f"Command: `{cmd}` ({seconds:.0f} s)  ",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['platform']}  ",
        f"Versions: Python {m['python']}, moto {m['moto']}, s3fs {m['s3fs']}, fsspec {m['fsspec']}  ",
        "Store: moto S3 server on 127.0.0.1 behind an asyncio proxy injecting per-request latency and a shared "
        "bandwidth limit (counts GETs and bytes sent).", "",
        "## 1. Remote fetches, Belady vs LRU (window shuffle, 3 epochs; baseline LRU in the same run)", "",
        "| cache size | Belady fetches (sim) | LRU fetches (sim) | Belady / LRU |", "|---|---|---|---|",
    ]
    for r in policy:
        lines.append(f"| {r['cache']} ({r['capacity_shards']} of {r['capacity_shards'] * 100 // int(r['cache'][:-1])}"
                     f" shards) | {r['belady']} ({r['belady_sim']}) | {r['lru']} ({r['lru_sim']}) | {r['ratio']:.3f} |")
    lines += ["", f"Target at 50 %: Belady <= 0.75x LRU -> **{at50['ratio']:.3f}x, "
              f"{'met' if at50['ratio'] <= 0.75 else 'NOT met'}**.", "",
              "## 2. Data-wait fraction with 100 ms per request (baseline: prefetch off, same run)", "",
              f"{pre['shards']} shards x {pre['shard_bytes'] >> 20} MiB, {pre['epochs']} epochs, window shuffle, "
              f"{pre['step_seconds'] * 1000:.0f} ms simulated step per sample, 200 MB/s link.", "",
              "| | data-wait fraction | without the first get (cold start) | first get s | wall s | store GETs |",
              "|---|---|---|---|---|---|"]
    for k in ("prefetch_off", "prefetch_on"):
        r = pre[k]
        lines.append(f"| {k.replace('_', ' ')} | {100 * r['wait_fraction']:.1f} % | {100 * r['steady_wait_fraction']:.1f} % "
                     f"| {r['first_wait_seconds']:.2f} | {r['seconds']:.1f} | {r['store_gets']} |")
    on = pre["prefetch_on"]["wait_fraction"]
    lines += ["", f"Target < 5 % with prefetch on -> **{100 * on:.1f} %, {'met' if on < 0.05 else 'NOT met'}** "
              f"(prefetch off: {100 * pre['prefetch_off']['wait_fraction']:.1f} %).", ""]
    dsr = pre.get("dataset", {})
    lines += ["### 2b. End to end through VLMDataset + make_loader (informational)", ""]
    if "skipped" in dsr:
        lines += [f"Skipped: {dsr['skipped']}", ""]
    else:
        lines += [f"{dsr['samples']} gen_raw samples in {dsr['shards']} shards ({dsr['bytes'] >> 20} MiB) on S3 with "
                  f"100 ms per request, {dsr['workers']} DataLoader workers, {dsr['step_seconds'] * 1000:.0f} ms step.",
                  "", "| | data-wait fraction | without the first batch | wall s | store GETs |", "|---|---|---|---|---|"]
        for k in ("prefetch_off", "prefetch_on"):
            r = dsr[k]
            lines.append(f"| {k.replace('_', ' ')} | {100 * r['wait_fraction']:.1f} % | "
                         f"{100 * r['steady_wait_fraction']:.1f} % | {r['seconds']:.1f} | {r['store_gets']} |")
        lines += ["", "Store GETs = workers x shards x 2: every worker reads every shard of a window, and each "
                  "shard's index file, which the dataset reads directly (not through the cache, so not "
                  "prefetched: 100 ms each in the worker's critical path); decoding shares the 2 cores. "
                  "Section 2 isolates the cache.", ""]
    lines += [f"## 3. {dmn['readers']} reader processes on one node (baseline: no daemon, same run)", "",
              "| | store bytes / dataset bytes | store GETs | bytes read by readers | corrupt reads |",
              "|---|---|---|---|---|"]
    for k in ("no_daemon", "daemon"):
        r = dmn[k]
        lines.append(f"| {k.replace('_', ' ')} | {r['ratio']:.3f}x | {r['store_gets']} | {r['bytes_read']} | {r['bad']} |")
    d = dmn["daemon"]
    lines += ["", f"Target 1.0x through the daemon -> **{d['ratio']:.3f}x on the wire (HTTP headers included), "
              f"{d['payload_ratio']:.3f}x payload**, {d['daemon_gets']} gets via the daemon, "
              f"{d['fallback_gets']} fallback gets.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    ap.add_argument("--out", default="bench_out/bench-cache.md")
    args = ap.parse_args()
    sz = Sizes()
    if args.quick:
        sz = Sizes(policy_shards=60, prefetch_shards=12, prefetch_epochs=1, daemon_shards=8, reads_per_shard=4)
    m = machine()
    print(f"machine: {m}", flush=True)
    t0 = time.time()
    store = SlowStore(cwd=str(REPO))
    tmp = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    try:
        print("1. Belady vs LRU", flush=True)
        policy = bench_policy(store, sz)
        print("2. prefetch and data wait (100 ms per request)", flush=True)
        pre = bench_prefetch(store, sz, tmp)
        pre["dataset"] = bench_dataset(store, tmp) if not args.quick else {"skipped": "--quick"}
        print(f"3. {sz.readers} readers through the daemon", flush=True)
        dmn = bench_daemon(store, sz, tmp)
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    cmd = "python tools/bench_cache.py" + (" --quick" if args.quick else "")
    text = report(m, policy, pre, dmn, cmd, time.time() - t0)
    print("\n" + text)
    write_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
