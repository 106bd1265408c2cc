"""GPU telemetry (off on a CPU, with the reason; real readings on a CUDA device) and the gradient norm."""
import math
import re
import urllib.request

import pytest
import torch

from vlmdata_pipelines.data import ListSource
from vlmdata_pipelines.model import TinyVLM, VLMConfig
from vlmdata_pipelines.packs import synthetic_pack
from vlmdata_pipelines.telemetry import GpuTelemetry, gradient_norm
from vlmdata_pipelines.train import TrainConfig, Trainer, init_distributed

NO_CUDA = "needs a CUDA device: GPU telemetry (NVML utilisation/memory, allocator peak) runs in tools/gpu_check.sh"


def test_cpu_device_disables_gpu_telemetry_with_the_reason():
    t = GpuTelemetry.open(torch.device("cpu"))
    assert not t.enabled and not t.nvml
    assert "no CUDA device" in t.reason and torch.__version__ in t.reason
    assert t.describe().startswith("GPU telemetry off: no CUDA device")
    assert t.sample() is None
    assert t.summary() == {"enabled": False, "nvml": False, "reason": t.reason, "samples": 0}
    t.close()


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_gradient_norm_with_and_without_clipping():
    cfg = VLMConfig.tiny()
    torch.manual_seed(0)
    model = TinyVLM(cfg)
    assert float(gradient_norm(model, 1.0)) == 0.0  # no gradient yet
    loss, _ = model(synthetic_pack([40, 30], [1, 0], cfg, 28, seed=1))
    (loss * 10).backward()
    expected = float(_grads(model).norm())
    assert float(gradient_norm(model, 0.0)) == pytest.approx(expected, rel=1e-5)
    assert float(_grads(model).norm()) == pytest.approx(expected, rel=1e-5)  # 0: no clipping
    assert expected > 1.0
    assert float(gradient_norm(model, 1.0)) == pytest.approx(expected, rel=1e-5)  # the norm before clipping
    assert float(_grads(model).norm()) == pytest.approx(1.0, rel=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_gpu_telemetry_readings_and_metrics(tmp_path):
    device = torch.device("cuda", 0)
    t = GpuTelemetry.open(device)
    assert t.enabled, t.reason
    x = torch.randn(4096, 4096, device=device)
    (x @ x).sum().item()
    s = t.sample()
    assert s.max_allocated >= x.numel() * 4
    if t.nvml:  # NVML present on a normal driver install
        assert 0.0 <= s.utilization <= 1.0 and 0 < s.memory_used <= s.memory_total and s.memory_peak >= s.memory_used
    t.close()

    cfg = VLMConfig.tiny()
    packs = [synthetic_pack([60, 40], [1, 0], cfg, 28, seed=i) for i in range(2)]
    trainer = Trainer(TrainConfig(steps=3, metrics_port=0, out_dir=str(tmp_path)), cfg, init_distributed())
    try:
        result = trainer.run(ListSource(packs))
        body = urllib.request.urlopen(trainer.metrics_url, timeout=10).read().decode()
    finally:
        trainer.close()
    g = result["gpu_telemetry"]
    assert g["enabled"] and g["samples"] == 3 and g["max_memory_allocated_bytes"] > 0
    assert float(re.search(r'vlmdata_gpu_max_memory_allocated_bytes{rank="0"} (\S+)', body).group(1)) > 0
    if g["nvml"]:
        assert re.search(r'vlmdata_gpu_memory_used_bytes{gpu="\d+",rank="0"} [1-9]', body)
        assert re.search(r'vlmdata_gpu_utilization_ratio{gpu="\d+",rank="0"} ', body)
        assert 0.0 <= g["mean_utilization"] <= 1.0 and not math.isnan(g["mean_utilization"])


def test_log_line_shows_grad_norm_and_gpu_reading():
    from vlmdata_pipelines.train import StepRecord, format_record

    rec = StepRecord(step=4, loss=2.5, label_tokens=10, real_tokens=1000, images=1, samples=2, packs=2,
                     step_seconds=0.5, wait_seconds=0.05, lr=1e-3, grad_norm=0.75)
    assert format_record(rec, 2).endswith("data-wait 10.0% lr 1.00e-03 grad-norm 0.750")
    rec.extra["gpu"] = {"gpu": "0", "utilization": 0.9, "memory_used": 3 * 2**30, "memory_peak": 3 * 2**30,
                        "memory_total": 80 * 2**30, "max_allocated": 2**30}
    assert format_record(rec, 2).endswith("grad-norm 0.750 gpu 90% mem 3.0/80 GiB")
    rec.extra["gpu"].update(utilization=None, memory_used=None, memory_total=None)  # no NVML
    assert format_record(rec, 2).endswith("gpu max-allocated 1.0 GiB")
