"""`vlmdata demo` end to end: corpus -> shards -> 2-rank torchrun training -> report."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO
from vlmdata_pipelines.demo import DemoResult, report


def _figure(text: str, label: str) -> float:
    m = re.search(rf"{label}\s+([\d,.]+)", text)
    assert m, f"no {label!r} in demo output:\n{text}"
    return float(m.group(1).replace(",", ""))


@pytest.mark.slow
@pytest.mark.integration  # the demo: torchrun, the cache daemon
def test_demo_small_run(tmp_path):
    cmd = [sys.executable, "-m", "vlmdata", "demo", "--workdir", str(tmp_path), "--samples", "60",
           "--steps", "8", "--corpus", "learnable", "--model", "tiny", "--image-size", "28", "--max-tokens", "512"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=400,
                          env=dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = proc.stdout
    assert "learnable (vlmdata_pipelines.corpus)" in out
    assert _figure(out, "real tokens/s") > 0
    assert _figure(out, "images/s") > 0
    assert 0 <= _figure(out, "data-wait fraction") < 100
    assert 50 < _figure(out, "packing efficiency") <= 100
    assert "ranks in sync      True" in out
    assert "What ran" in out and "Results" in out and "image decode       in the DataLoader workers" in out
    assert re.search(r"dataset\s+1 shards, 60 samples", out), out
    assert "Kept in " + str(tmp_path) in out
    m = re.search(r"loss\s+([\d.]+) -> ([\d.]+)", out)
    assert m and float(m.group(2)) < float(m.group(1))
    results = [json.load(open(tmp_path / "train" / f"result.rank{r}.json")) for r in (0, 1)]
    assert results[0]["checksum"] == results[1]["checksum"]
    assert sum(r["loader_stats"]["samples"] for r in results) > 0
    # the shards were read through the node's cache daemon (the default): its SSD tier holds every one of them
    assert "through the cache daemon" in out
    manifest = json.load(open(tmp_path / "dataset" / "manifest.json"))
    cached = [f for f in os.listdir(tmp_path / "cache") if f.endswith(".data")]
    assert len(cached) == len(manifest["shards"]) > 0
    # every shard read went through the daemon and is counted in the hit rate (the daemon prefetches
    # the announced shards, so even first reads may hit its disk tier)
    m = re.search(r"cache hit rate\s+([\d.]+) %\s+of (\d+) shard reads", out)
    assert m, out
    assert 0 <= float(m.group(1)) <= 100 and int(m.group(2)) >= len(manifest["shards"])
    # the same ranks' results reported for a run without the daemon say so
    without = report(DemoResult(corpus="raw", daemon=None, ranks=results, shard_seconds=1.0,
                                train_seconds=1.0, max_tokens=1024))
    assert "cache daemon       not used" in without


def test_demo_command_is_registered():
    from vlmdata.cli import build_parser

    args = build_parser().parse_args(["demo", "--steps", "3", "--no-daemon"])
    assert args.steps == 3 and args.no_daemon and args.func is not None


def test_demo_corpus_needs_nothing_beside_the_checkout(tmp_path, monkeypatch):
    """The demo's corpora are made by the project itself: no ../shared, no VLMDATA_GEN_RAW."""
    import vlmdata_pipelines.demo as demo

    monkeypatch.delenv("VLMDATA_GEN_RAW", raising=False)
    used = demo.make_corpus(demo.DemoConfig(samples=5), str(tmp_path / "raw"))
    assert used == "raw (raw_corpus.py)"
    learnable = demo.make_corpus(demo.DemoConfig(samples=5, corpus="learnable"), str(tmp_path / "learn"))
    assert learnable.startswith("learnable")
    for folder in ("raw", "learn"):
        lines = open(tmp_path / folder / "data.jsonl").read().splitlines()
        assert len(lines) == 5 and all(json.loads(x)["conversations"] for x in lines)
    monkeypatch.setenv("VLMDATA_GEN_RAW", str(tmp_path / "absent.py"))
    with pytest.raises(FileNotFoundError, match="VLMDATA_GEN_RAW"):
        demo.make_corpus(demo.DemoConfig(samples=5), str(tmp_path / "raw2"))
    with pytest.raises(SystemExit, match="unknown corpus"):
        demo.make_corpus(demo.DemoConfig(samples=5, corpus="gen_raw"), str(tmp_path / "raw3"))


def _result(**overrides):
    from vlmdata_pipelines.demo import DemoConfig, DemoResult

    rank = {"world_size": 2, "steps": [0, 1, 2], "device": "cpu", "losses": [5.0, 4.0, 3.5], "checksum": 1.0,
            "tokens_per_second": 1234.0, "images_per_second": 5.0, "data_wait_fraction": 0.02,
            "total_real_tokens": 900, "total_packs": 1, "params": 4_400_000, "decode_stage": None,
            "loader_stats": {"samples": 10, "skipped": {"corrupt_image": 1},
                             "cache_hits": {"memory": 2, "disk": 1, "remote": 1}, "cache_misses": {"memory": 2}}}
    fields = {"corpus": "learnable", "daemon": None, "ranks": [rank, dict(rank, data_wait_fraction=0.08)],
              "shard_seconds": 1.0, "train_seconds": 2.0, "max_tokens": 1024, "config": DemoConfig(),
              "dataset": {"shards": 2, "samples": 200, "images": 300, "bytes": 3_200_000}}
    fields.update(overrides)
    return DemoResult(**fields)


def test_cache_hit_rate_counts_reads_served_by_a_cache_tier():
    from vlmdata_pipelines.demo import cache_hit_rate

    assert cache_hit_rate({"hits": {"memory": 3, "disk": 1, "remote": 4}, "misses": {"memory": 5, "disk": 4}}) == (
        0.5, 8)
    # a failed fetch ("remote" miss) is a read that no cache served
    assert cache_hit_rate({"hits": {"disk": 1}, "misses": {"remote": 1}}) == (0.5, 2)
    assert cache_hit_rate({"hits": {}, "misses": {}}) == (0.0, 0)
    # the daemon's `joined` reads waited for a fetch in flight: reads, not hits
    assert cache_hit_rate({"hits": {"disk": 1}, "misses": {}, "joined": 3}) == (0.25, 4)


def test_report_explains_each_figure():
    from vlmdata_pipelines.demo import report

    text = report(_result())
    assert "data-wait fraction 8.0 %" in text and "bottleneck" in text  # the worst rank, flagged over 5 %
    assert "packing efficiency 87.9 %" in text  # 900 real tokens / (1 pack x 1024)
    # the packs carry cache counts (both ranks summed): 6 of 8 reads from memory/disk
    assert "cache hit rate     75.0 %   of 8 shard reads" in text and "counted in the packs" in text
    assert "20 trained (0.10 epochs), 2 skipped" in text and "4.4 M params" in text
    assert "dataset            2 shards, 200 samples, 300 images, 3.2 MB" in text
    assert "--workdir DIR keeps" in text
    # no counts in the packs: the daemon's own counters are used; none at all: no hit-rate line
    ranks = [dict(r, loader_stats={"samples": 10}) for r in _result().ranks]
    daemon = report(_result(ranks=ranks, daemon="/tmp/x.sock",
                            daemon_stats={"hits": {"disk": 3, "remote": 1}, "misses": {"memory": 4}}))
    assert "cache hit rate     75.0 %   of 4 shard reads" in daemon and "counted by the cache daemon" in daemon
    assert "cache hit rate" not in report(_result(ranks=ranks))
    # both: the daemon's reads and the workers' own (fallback) reads are added up
    both = report(_result(daemon="/tmp/x.sock", daemon_stats={"hits": {"disk": 3, "remote": 1}, "misses": {}}))
    assert "cache hit rate     75.0 %   of 12 shard reads" in both
    assert "counted in the packs and by the cache daemon" in both
    joined = report(_result(ranks=ranks, daemon="/tmp/x.sock", daemon_stats={"hits": {}, "misses": {}, "joined": 2}))
    assert "cache hit rate     0.0 %   of 2 shard reads" in joined and "2 waited for a prefetch in flight" in joined
