"""The end-to-end demo: generate a corpus, shard it, train a few dozen packed steps on 2 local
ranks (through the node's cache daemon when vlmdata has one), and print what happened.

    vlmdata demo [--workdir DIR] [--samples 400] [--steps 30] [--nproc 2]

Corpus: vlmdata's raw benchmark corpus (`vlmdata.testing.raw_corpus`: realistic image sizes and
long-tailed texts; $VLMDATA_GEN_RAW names another generator with the same arguments), or with
`--corpus learnable` the small learnable corpus of `vlmdata_pipelines.corpus`, whose loss falls fast.
Every child process is started with an explicit argument list (no shell).
"""
from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from vlmdata.sysinfo import cpu_model
from vlmdata.testing import generator_script

log = logging.getLogger("vlmdata_pipelines.demo")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class DemoConfig:
    workdir: str | None = None        # default: a fresh temporary directory (removed unless keep)
    samples: int = 200
    steps: int = 30
    nproc: int = 2
    corpus: str = "raw"               # "raw" | "learnable"
    image_size: int = 56
    max_tokens: int = 1024
    model: str = "small"
    num_workers: int = 1
    daemon: bool = True
    keep: bool = False
    dataset: str | None = None        # an already sharded dataset: skip generation and sharding
    extra_train_args: list[str] = field(default_factory=list)


@dataclass
class DemoResult:
    corpus: str
    daemon: str | None
    ranks: list[dict]
    shard_seconds: float
    train_seconds: float
    max_tokens: int
    config: DemoConfig = field(default_factory=DemoConfig)
    dataset: dict = field(default_factory=dict)         # shards, samples, images, bytes (from the manifest)
    daemon_stats: dict | None = None                    # the cache daemon's own counters, read before it stops
    workdir: str | None = None                          # None when it was a temporary directory, now removed

    @property
    def cache_hits(self) -> tuple[dict, str] | None:
        """Shard reads per serving tier, and where they were counted, or None when nothing counted any.

        The daemon counts the reads it serves; the packs carry the counts of caches inside the
        workers (an in-process cache, or the client's fallback when the daemon is unreachable).
        The two are disjoint, so they are added up.
        """
        total: dict = {"hits": {}, "misses": {}, "joined": 0}
        sources = []
        pack_counts = [((r.get("loader_stats") or {}).get("cache_hits") or {},
                        (r.get("loader_stats") or {}).get("cache_misses") or {}) for r in self.ranks]
        for name, counts in (("in the packs", [{"hits": h, "misses": m} for h, m in pack_counts]),
                             ("by the cache daemon", [self.daemon_stats or {}])):
            for c in counts:
                for key in ("hits", "misses"):
                    for tier, n in (c.get(key) or {}).items():
                        total[key][tier] = total[key].get(tier, 0) + n
                total["joined"] += int(c.get("joined") or 0)
            if any(cache_hit_rate(c)[1] for c in counts):
                sources.append(name)
        if not sources:
            return None
        return total, "counted " + " and ".join(sources)

    @property
    def tokens_per_second(self) -> float:
        return self.ranks[0]["tokens_per_second"]

    @property
    def images_per_second(self) -> float:
        return self.ranks[0]["images_per_second"]

    @property
    def data_wait_fraction(self) -> float:
        """The worst rank's fraction of step time spent waiting for data."""
        return max(r["data_wait_fraction"] for r in self.ranks)

    @property
    def packing_efficiency(self) -> float:
        """Real tokens / token budget of the packs (all steps, all ranks)."""
        r = self.ranks[0]
        return r["total_real_tokens"] / max(r["total_packs"] * self.max_tokens, 1)


def cache_hit_rate(stats: dict) -> tuple[float, int]:
    """(fraction of demand shard reads served by memory or disk, number of reads).

    `stats` holds per-tier `hits` (reads served by that tier) and `misses`; a read served by
    "remote" came from the store, and a "remote" miss is a failed fetch. The daemon also counts
    `joined` reads, which waited for a fetch already in flight (a prefetch): not hits.
    """
    hits, misses = stats.get("hits") or {}, stats.get("misses") or {}
    reads = sum(hits.values()) + misses.get("remote", 0) + int(stats.get("joined") or 0)
    cached = sum(n for tier, n in hits.items() if tier != "remote")
    return (cached / reads if reads else 0.0), reads


def query_daemon_stats(address: str, timeout: float = 5.0) -> dict | None:
    """The cache daemon's counters (its `stats` request), or None when it does not answer."""
    from vlmdata.cache.daemon import connect, recv_msg, send_msg
    from vlmdata.errors import ProtocolError

    try:
        sock = connect(address, timeout=timeout)
        try:
            send_msg(sock, {"op": "stats"})
            reply = recv_msg(sock)
        finally:
            sock.close()
    except (OSError, ProtocolError) as exc:
        log.warning("cache daemon at %s gave no stats: %s", address, exc)
        return None
    return reply.get("stats") if isinstance(reply, dict) and reply.get("ok") else None


def dataset_summary(path: str) -> dict:
    """Shards, samples, images and bytes of a sharded dataset (from its manifest)."""
    from vlmdata.formats import Manifest

    shards = Manifest.load(path).shards
    return {"shards": len(shards), "samples": sum(x.samples for x in shards),
            "images": sum(x.images for x in shards), "bytes": sum(x.bytes for x in shards)}


def _torch_version() -> str:
    import torch

    return torch.__version__





def make_corpus(cfg: DemoConfig, out: str) -> str:
    """Write the raw corpus; returns which generator was used."""
    if cfg.corpus not in ("raw", "learnable"):
        raise SystemExit(f"demo: unknown corpus {cfg.corpus!r} (raw or learnable)")
    if cfg.corpus == "raw":
        script = generator_script()
        subprocess.run([sys.executable, script, out, "--samples", str(cfg.samples), "--seed", "0"],
                       check=True, stdout=subprocess.DEVNULL)
        return f"raw ({os.path.basename(script)})"
    from vlmdata_pipelines.corpus import generate

    generate(out, cfg.samples, seed=0)
    return "learnable (vlmdata_pipelines.corpus)"


def shard(raw: str, out: str, image_size: int) -> None:
    from vlmdata.ingest import ShardConfig, shard_dataset

    # Store images already shrunk (4x the training side keeps the decode cheap and the crop sharp).
    shard_dataset(ShardConfig(inputs=[os.path.join(raw, "data.jsonl")], output=out, max_samples_per_shard=100,
                              resize_max_side=max(4 * image_size, 128), workers=2))


class CacheDaemonProcess:
    """`vlmdata cache-daemon` on a Unix socket in the work dir, stopped on exit.

    Its output goes to WORKDIR/cache-daemon.log (a file, not a pipe nobody drains).
    """

    def __init__(self, workdir: str, timeout: float = 60.0):
        self.socket = os.path.join(workdir, "cache.sock")
        self.log_path = os.path.join(workdir, "cache-daemon.log")
        cmd = [sys.executable, "-m", "vlmdata", "cache-daemon", "--cache-dir", os.path.join(workdir, "cache"),
               "--disk-bytes", "2G", "--socket", self.socket]
        with open(self.log_path, "wb") as log_file:
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT,
                                         env=dict(os.environ, PYTHONPATH=_pythonpath()))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if "cache daemon ready" in self._output():
                return
            time.sleep(0.1)  # polling a log file for the readiness line
        self.stop()
        raise RuntimeError(f"cache daemon did not start:\n{self._output()[-2000:]}")

    def _output(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _pythonpath() -> str:
    return os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)


def train_command(cfg: DemoConfig, data: str, out: str, daemon: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(cfg.nproc),
           "-m", "vlmdata_pipelines.train", "--data", data, "--steps", str(cfg.steps), "--out", out,
           "--image-size", str(cfg.image_size), "--max-tokens", str(cfg.max_tokens), "--model", cfg.model,
           "--num-workers", str(cfg.num_workers), "--log-every", "5", "--warmup", "3"]
    if daemon:
        cmd += ["--cache-daemon", daemon]
    return cmd + list(cfg.extra_train_args)


def run_demo(cfg: DemoConfig) -> DemoResult:
    """Corpus -> shards -> 2-rank packed training; returns the per-rank results."""
    workdir = cfg.workdir or tempfile.mkdtemp(prefix="vlmdata-demo-")
    os.makedirs(workdir, exist_ok=True)
    raw, data, out = (os.path.join(workdir, d) for d in ("raw", "dataset", "train"))
    daemon = None
    try:
        print(f"vlmdata demo: corpus -> shards -> {cfg.steps} packed training steps on {cfg.nproc} local ranks "
              f"(work directory {workdir})", flush=True)
        t0 = time.perf_counter()
        if cfg.dataset:
            data, corpus = cfg.dataset, f"existing dataset {cfg.dataset}"
            print(f"[1-2/3] using the sharded dataset {data}", flush=True)
        else:
            corpus = make_corpus(cfg, raw)
            print(f"[1/3] corpus: {cfg.samples} samples from {corpus} in {raw}", flush=True)
            shard(raw, data, cfg.image_size)
            print(f"[2/3] sharded into {data} ({time.perf_counter() - t0:.1f} s with generation)", flush=True)
        shard_seconds = time.perf_counter() - t0
        if cfg.daemon:
            daemon = CacheDaemonProcess(workdir)
        where = f"through the cache daemon at {daemon.socket}" if daemon else "reading shards directly"
        print(f"[3/3] training {cfg.steps} steps on {cfg.nproc} ranks, {where}", flush=True)
        t1 = time.perf_counter()
        env = dict(os.environ, PYTHONPATH=_pythonpath(), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        subprocess.run(train_command(cfg, data, out, daemon.socket if daemon else None), cwd=REPO, env=env,
                       check=True)
        train_seconds = time.perf_counter() - t1
        ranks = []
        for r in range(cfg.nproc):
            with open(os.path.join(out, f"result.rank{r}.json")) as f:
                ranks.append(json.load(f))
        return DemoResult(corpus, daemon.socket if daemon else None, ranks, shard_seconds, train_seconds,
                          cfg.max_tokens, config=cfg, dataset=dataset_summary(data),
                          daemon_stats=query_daemon_stats(daemon.socket) if daemon else None,
                          workdir=workdir if (cfg.keep or cfg.workdir) else None)
    finally:
        if daemon:
            daemon.stop()
        if not cfg.keep and not cfg.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def _size(nbytes: float) -> str:
    """Bytes in decimal units (B, kB, MB, GB)."""
    for unit in ("B", "kB", "MB"):
        if nbytes < 1000:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return f"{nbytes:.1f} GB"


def report(result: DemoResult) -> str:
    """What the demo did and what it measured, each figure with a short explanation."""
    cfg, r0, ds = result.config, result.ranks[0], result.dataset
    losses = r0["losses"]
    skipped = sum(sum((r.get("loader_stats") or {}).get("skipped", {}).values()) for r in result.ranks)
    samples = sum((r.get("loader_stats") or {}).get("samples", 0) for r in result.ranks)
    decode = (f"in the training process ({r0['decode_stage']}, GPU)" if r0.get("decode_stage")
              else f"in the DataLoader workers ({cfg.num_workers} per rank)")
    params = f", {r0['params'] / 1e6:.1f} M params" if r0.get("params") else ""
    wait = 100 * result.data_wait_fraction
    lines = [
        "vlmdata demo: generated a corpus, sharded it, and trained a small vision-language model with torchrun",
        "on packed batches (several samples per sequence, each attending only to itself).",
        "",
        "What ran",
        f"  machine            {cpu_model()}, {os.cpu_count()} cores, python {platform.python_version()}, "
        f"torch {_torch_version()}",
        f"  corpus             {result.corpus}",
    ]
    if ds:
        lines.append(f"  dataset            {ds['shards']} shards, {ds['samples']:,} samples, {ds['images']:,} images, "
                     f"{_size(ds['bytes'])}")
    lines += [
        f"  cache daemon       {result.daemon or 'not used'}",
        f"  training           {r0['world_size']} ranks x {len(r0['steps'])} steps on {r0['device']}, "
        f"model {cfg.model}{params}, {result.max_tokens}-token packs, {cfg.image_size} px images",
        f"  image decode       {decode}",
        "",
        "Results",
        f"  loss               {losses[0]:.3f} -> {losses[-1]:.3f}"
        + ("   (falling: the model learns from the packed data)" if losses[-1] < losses[0] else ""),
        f"  real tokens/s      {result.tokens_per_second:,.0f}   all ranks, padding excluded, after the first step",
        f"  images/s           {result.images_per_second:,.1f}",
        f"  data-wait fraction {wait:.1f} %   of step time the slowest rank waited for its next batch"
        + (" (the data pipeline keeps up)" if wait < 5 else " (the data pipeline is a bottleneck)"),
        f"  packing efficiency {100 * result.packing_efficiency:.1f} %   of each pack's {result.max_tokens} token "
        "slots hold real tokens (the rest is padding)",
    ]
    hits = result.cache_hits
    if hits is not None:
        rate, reads = cache_hit_rate(hits[0])
        joined = int(hits[0].get("joined") or 0)
        lines.append(f"  cache hit rate     {100 * rate:.1f} %   of {reads} shard reads served from memory/disk, "
                     f"not the store ({hits[1]}"
                     + (f"; {joined} waited for a prefetch in flight)" if joined else ")"))
    lines += [
        f"  samples            {samples:,} trained"
        + (f" ({samples / ds['samples']:.2f} epochs)" if ds.get("samples") else "")
        + (f", {skipped:,} skipped (bad data, counted)" if skipped else ", none skipped"),
        f"  ranks in sync      {len({round(r['checksum'], 6) for r in result.ranks}) == 1}   "
        "(same parameters on every rank after the last step)",
        f"  time               shard {result.shard_seconds:.1f} s, train {result.train_seconds:.1f} s",
        "",
    ]
    if result.workdir:
        lines.append(f"Kept in {result.workdir}: dataset/ (shards + manifest.json), train/steps.rank*.jsonl "
                     "(one line per step), train/result.rank*.json")
    else:
        lines.append("The temporary work directory was removed; --workdir DIR keeps the dataset and per-step logs.")
    return "\n".join(lines)
