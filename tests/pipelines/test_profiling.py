"""`--profile`: the trainer (one process, a 1-rank group) records a window of steps with torch.profiler,
writes a Chrome/TensorBoard trace, and its step breakdown adds up to the measured step time within 5 %;
the breakdown reaches the metrics endpoint; data wait and the in-process decode stage are phases of
their own; the vision tower and projector are found by name."""
import json
import logging
import os
import re
import urllib.request

import pytest
import torch
from torch import nn

from tests.helpers.train import make_dataset
from vlmdata_pipelines.data import DataOptions, DatasetSource, ListSource, StagedSource, model_fields_for
from vlmdata_pipelines.model import PIXEL_MEAN, PIXEL_STD, TinyVLM, VLMConfig
from vlmdata_pipelines.packs import synthetic_pack
from vlmdata_pipelines.profiling import ProfileOptions, phase, phase_modules
from vlmdata_pipelines.step_breakdown import PHASES
from vlmdata_pipelines.train import TrainConfig, Trainer, check_options, init_distributed, train


def _steps(out) -> dict[int, dict]:
    with open(os.path.join(out, "steps.rank0.jsonl")) as f:
        return {s["step"]: s for s in map(json.loads, f)}


def test_profiled_run_trace_breakdown_and_metrics(tmp_path, caplog):
    cfg = VLMConfig.tiny()
    packs = [synthetic_pack([120, 90, 60], [1, 0, 2], cfg, 28, seed=i) for i in range(3)]
    # two windows of one step: step 0 skipped, 1 warm-up, 2 recorded; 3 skipped, 4 warm-up, 5 recorded
    opts = ProfileOptions(steps=1, wait=1, warmup=1, repeat=2)
    trainer = Trainer(TrainConfig(steps=7, metrics_port=0, out_dir=str(tmp_path), profile=opts), cfg,
                      init_distributed())
    try:
        with caplog.at_level(logging.INFO, logger="vlmdata_pipelines.train"):
            result = trainer.run(ListSource(packs))
        body = urllib.request.urlopen(trainer.metrics_url, timeout=10).read().decode()
    finally:
        trainer.close()
    windows = result["profile"]
    assert [w["steps"] for w in windows] == [[2], [5]]
    # after its last window the profiler stopped and took its forward hooks off the model
    assert trainer.profiler.windows == 2 and trainer.profiler._prof is None
    assert not trainer.module.vision._forward_pre_hooks and not trainer.module.projector._forward_hooks
    measured = _steps(tmp_path)
    for w in windows:
        assert set(w["phase_seconds"]) == set(PHASES)
        # the window's measured time is the trainer's own step times for those steps
        assert w["measured_seconds"] == pytest.approx(sum(measured[s]["step_seconds"] for s in w["steps"]))
        # target: the phases add up to the measured step time within 5 %
        assert abs(w["total_seconds"] - w["measured_seconds"]) <= 0.05 * w["measured_seconds"]
        assert sum(w["shares"].values()) == pytest.approx(w["total_seconds"] / w["measured_seconds"])
        secs = w["phase_seconds"]
        for p in ("vision_encoder", "projector", "lm_forward", "backward", "optimizer"):
            assert secs[p] > 0, p
        assert secs["other"] < 0.25 * w["total_seconds"]  # the named phases cover the step
        # the trace is a Chrome trace (TensorBoard's plugin and Perfetto read it) holding the ranges
        assert os.path.basename(w["trace"]) == f"rank0.steps{w['steps'][0] + 1}-{w['steps'][-1] + 1}.pt.trace.json"
        with open(w["trace"]) as f:
            names = {e.get("name") for e in json.load(f)["traceEvents"]}
        assert {f"vlmdata.step#{w['steps'][0]}", "vlmdata.vision_encoder", "vlmdata.projector",
                "vlmdata.lm_forward", "vlmdata.backward", "vlmdata.optimizer", "vlmdata.data_wait"} <= names
    with open(tmp_path / "profile" / "breakdown.rank0.jsonl") as f:
        assert [json.loads(x)["steps"] for x in f] == [[2], [5]]
    # the endpoint carries both windows' seconds per phase
    for p in ("vision_encoder", "lm_forward", "backward", "optimizer"):
        m = re.search(rf'vlmdata_train_phase_seconds_total{{phase="{p}",rank="0"}} (\S+)', body)
        assert m and float(m.group(1)) == pytest.approx(sum(w["phase_seconds"][p] for w in windows)), p
    # grad norm and learning rate of the last step
    for metric, key in (("vlmdata_train_learning_rate", "lr"), ("vlmdata_train_grad_norm", "grad_norm")):
        value = float(re.search(rf'{metric}{{rank="0"}} (\S+)', body).group(1))
        assert value == pytest.approx(measured[6][key]), metric
    assert result["grad_norms"] == [measured[s]["grad_norm"] for s in range(7)]
    assert all(g > 0 for g in result["grad_norms"])
    text = caplog.text
    assert "profile of step 3 " in text and "profile of step 6 " in text
    assert "language model forward" in text and "measured step" in text
    if torch.cuda.is_available():  # tools/gpu_check.sh runs this file on a GPU too
        assert result["gpu_telemetry"]["enabled"] and "GPU telemetry" in text
    else:  # GPU telemetry off, and why, in the run's output and its result
        assert "GPU telemetry off: no CUDA device" in text
        assert result["gpu_telemetry"]["enabled"] is False and "no CUDA device" in result["gpu_telemetry"]["reason"]


def _normalise(batch: dict) -> dict:
    """A real in-process stage: uint8 pixels -> normalised float (what the DALI GPU stage hands over)."""
    px = batch["pixel_values"].float() / 255.0
    mean, std = torch.tensor(PIXEL_MEAN).view(1, 3, 1, 1), torch.tensor(PIXEL_STD).view(1, 3, 1, 1)
    return {**batch, "pixel_values": (px - mean) / std}


def test_data_wait_and_decode_stage_are_phases(tmp_path):
    data = make_dataset(str(tmp_path / "corpus"), samples=24, seed=4, shard_size=12)
    opts = DataOptions(data=data, max_tokens=512, image_size=28, num_workers=0, decoder="pillow")
    cfg = VLMConfig.tiny(**model_fields_for(opts))
    result = train(TrainConfig(steps=4, out_dir=str(tmp_path / "out"), profile=ProfileOptions(steps=2, wait=0)),
                   cfg, lambda info: StagedSource(DatasetSource(opts, info.rank, info.world_size), _normalise))
    (w,) = result["profile"]
    # no DataLoader worker: reading and decoding the pack happen inside next(), i.e. in data_wait
    assert w["phase_seconds"]["data_wait"] > 0 and w["phase_seconds"]["decode_stage"] > 0
    assert abs(w["total_seconds"] - w["measured_seconds"]) <= 0.05 * w["measured_seconds"]


def test_phase_modules_by_name():
    model = TinyVLM(VLMConfig.tiny())
    found = phase_modules(model)
    assert found["vision_encoder"] is model.vision and found["projector"] is model.projector

    class HfLike(nn.Module):  # Qwen2-VL-like layout: the merger (projector) inside the vision tower
        def __init__(self):
            super().__init__()
            self.model = nn.Module()
            self.model.visual = nn.Module()
            self.model.visual.merger = nn.Linear(2, 2)
            self.model.language_model = nn.Linear(2, 2)

    hf = HfLike()
    assert phase_modules(hf) == {"vision_encoder": hf.model.visual, "projector": hf.model.visual.merger}
    assert phase_modules(nn.Linear(2, 2)) == {}


def test_profile_options_are_checked():
    with pytest.raises(ValueError, match="give --out DIR"):
        check_options(TrainConfig(profile=ProfileOptions(steps=2)))
    with pytest.raises(ValueError, match="--profile-warmup must be >= 0"):
        ProfileOptions(steps=2, warmup=-1).validate()
    with pytest.raises(ValueError, match="unknown phase"):
        phase("loading")
