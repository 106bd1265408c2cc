"""`vlmdata demo` end to end: corpus -> shards -> 2-rank torchrun training -> report."""
import json
import os
import re
import subprocess
import sys

import pytest
from train_fixtures import REPO

from pipelines.demo import daemon_available


def _figure(text: str, label: str) -> float:
    m = re.search(rf"{label}\s+([\d,.]+)", text)
    assert m, f"no {label!r} in demo output:\n{text}"
    return float(m.group(1).replace(",", ""))


@pytest.mark.slow
def test_demo_small_run(tmp_path):
    cmd = [sys.executable, "-m", "vlmdata.cli", "demo", "--workdir", str(tmp_path), "--samples", "60",
           "--steps", "8", "--corpus", "builtin", "--model", "tiny", "--image-size", "28", "--max-tokens", "512"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=400,
                          env=dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = proc.stdout
    assert "builtin (pipelines.corpus)" in out
    assert _figure(out, "real tokens/s") > 0
    assert _figure(out, "images/s") > 0
    assert 0 <= _figure(out, "data-wait fraction") < 100
    assert 50 < _figure(out, "packing efficiency") <= 100
    assert "ranks in sync      True" in out
    m = re.search(r"loss\s+([\d.]+) -> ([\d.]+)", out)
    assert m and float(m.group(2)) < float(m.group(1))
    results = [json.load(open(tmp_path / "train" / f"result.rank{r}.json")) for r in (0, 1)]
    assert results[0]["checksum"] == results[1]["checksum"]
    assert sum(r["loader_stats"]["samples"] for r in results) > 0
    if daemon_available():
        # the shards were read through the node's cache daemon: its SSD tier holds every one of them
        assert "through the cache daemon" in out
        manifest = json.load(open(tmp_path / "dataset" / "manifest.json"))
        cached = [f for f in os.listdir(tmp_path / "cache") if f.endswith(".data")]
        assert len(cached) == len(manifest["shards"]) > 0
    else:
        assert "cache daemon       not used" in out


def test_demo_command_is_registered():
    from vlmdata.cli import build_parser

    args = build_parser().parse_args(["demo", "--steps", "3", "--no-daemon"])
    assert args.steps == 3 and args.no_daemon and args.func is not None


def test_gen_raw_absent_falls_back_to_builtin(tmp_path, monkeypatch):
    """Without ../shared the demo still has a corpus: the built-in generator."""
    import pipelines.demo as demo

    monkeypatch.setattr(demo, "REPO", str(tmp_path / "nowhere"))
    monkeypatch.delenv("VLMDATA_GEN_RAW", raising=False)
    assert demo.find_gen_raw() is None
    used = demo.make_corpus(demo.DemoConfig(samples=5), str(tmp_path / "raw"))
    assert used.startswith("builtin")
    lines = open(tmp_path / "raw" / "data.jsonl").read().splitlines()
    assert len(lines) == 5 and all(json.loads(x)["conversations"] for x in lines)
    with pytest.raises(SystemExit, match="gen_raw"):
        demo.make_corpus(demo.DemoConfig(samples=5, corpus="gen_raw"), str(tmp_path / "raw2"))
