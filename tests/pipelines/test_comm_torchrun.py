"""Real 2-rank torchrun jobs (gloo, CPU) with every DDP communication hook and gradient accumulation.

- One job (`vlmdata_pipelines.hook_sweep`) trains none, bf16, fp16, powersgd and powersgd with a static graph
  side by side, 4 steps of 2 micro-batches each, with small buckets (several per step): after the run
  every rank holds the same parameters for every hook, and the bytes counted per step are what each
  hook must send (fp32 buckets once per step: no_sync micro-batches send nothing; half of it for bf16/
  fp16; PowerSGD's factors after its 2-step warm-up).
- One `vlmdata_pipelines.train` job exercises the command line: fp16 hook, static graph, accumulation and
  `--profile` under DDP (communication shows up in the breakdown, which adds up to the step time).
"""
import json
import math
import os

import pytest

from tests.helpers.train import make_dataset, torchrun
from vlmdata_pipelines.model import TinyVLM, VLMConfig

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # torchrun

COMMON = ["--image-size", "28", "--max-tokens", "512"]
HOOKS = ["none", "bf16", "fp16", "powersgd", "powersgd+static"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(str(tmp_path_factory.mktemp("corpus")), samples=80, seed=0)


@pytest.fixture(scope="module")
def params(dataset):
    from vlmdata_pipelines.data import DataOptions, model_fields_for

    cfg = VLMConfig.tiny(**model_fields_for(DataOptions(data=dataset, image_size=28)))
    return sum(p.numel() for p in TinyVLM(cfg).parameters())


def test_every_hook_with_accumulation_keeps_ranks_identical(dataset, params, tmp_path):
    out = tmp_path / "sweep"
    torchrun(["--nproc_per_node", "2", "-m", "vlmdata_pipelines.hook_sweep", "--data", dataset, "--out", str(out),
              "--configs", ",".join(HOOKS), "--steps", "4", "--accum", "2", "--powersgd-start-iter", "2",
              "--ddp-bucket-mb", "0.05", "--log-every", "1", *COMMON], timeout=420)
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["world_size"] == 2 and list(sweep["configs"]) == HOOKS
    full = 4 * params
    for spec, r in sweep["configs"].items():
        c0, c1 = r["checksums"]
        assert c0 == c1, f"{spec}: ranks diverged ({c0} vs {c1})"
        assert len(r["losses"]) == 4 and all(math.isfinite(x) for x in r["losses"]), spec
        per_rank = [json.loads((out / spec / f"result.rank{k}.json").read_text()) for k in (0, 1)]
        assert per_rank[0]["checksum"] == per_rank[1]["checksum"] == c0
        assert per_rank[0]["comm"]["allreduce_bytes_per_step"] == per_rank[1]["comm"]["allreduce_bytes_per_step"]
    cfgs = sweep["configs"]
    # the same initial weights and packs: the first step's loss is the same for every hook
    assert len({round(r["losses"][0], 10) for r in cfgs.values()}) == 1
    assert cfgs["none"]["allreduce_bytes_per_step"] == [full] * 4
    assert cfgs["bf16"]["allreduce_bytes_per_step"] == [full // 2] * 4
    assert cfgs["fp16"]["allreduce_bytes_per_step"] == [full // 2] * 4
    psgd = cfgs["powersgd"]["allreduce_bytes_per_step"]
    assert psgd[:2] == [full, full] and psgd[2] == psgd[3] < 0.1 * full
    # static graph: DDP's first step synchronises both micro-batches (torch 2.13 cannot record the graph
    # under no_sync), which also counts as PowerSGD's two warm-up iterations
    static = cfgs["powersgd+static"]["allreduce_bytes_per_step"]
    assert static[0] == 2 * full and static[1:] == [psgd[2]] * 3
    # compression changes the updates only slightly at this learning rate
    for spec in ("bf16", "fp16", "powersgd"):
        assert abs(cfgs[spec]["losses"][-1] - cfgs["none"]["losses"][-1]) < 0.05 * cfgs["none"]["losses"][-1]


def test_command_line_hook_static_graph_and_profile(dataset, params, tmp_path):
    out = tmp_path / "run"
    torchrun(["--nproc_per_node", "2", "-m", "vlmdata_pipelines.train", "--data", dataset, "--out", str(out), *COMMON,
              "--num-workers", "1", "--steps", "5", "--accum", "2", "--comm-hook", "fp16", "--ddp-static-graph",
              "--ddp-bucket-mb", "0.05", "--profile", "2", "--metrics-port", "0"], timeout=300)
    r0, r1 = (json.loads((out / f"result.rank{k}.json").read_text()) for k in (0, 1))
    assert r0["checksum"] == r1["checksum"]
    assert r0["comm"]["hook"] == "fp16" and r0["comm"]["options"]["static_graph"]
    assert r0["comm"]["allreduce_bytes_per_step"] == [2 * 2 * params] + [2 * params] * 4
    for r in (r0, r1):
        (w,) = r["profile"]
        assert w["steps"] == [2, 3]
        assert abs(w["total_seconds"] - w["measured_seconds"]) <= 0.05 * w["measured_seconds"]
        assert w["phase_seconds"]["communication"] > 0 and w["comm_in_flight_seconds"] > 0
        assert os.path.exists(w["trace"])
        assert r["gpu_telemetry"]["enabled"] is False
        assert len(r["grad_norms"]) == 5 and all(g > 0 for g in r["grad_norms"])
