"""DDP communication options and the byte-counting hooks, in one process (a 1-rank gloo group):
the counted bytes match what each hook must all-reduce, computed here from the parameter shapes.
The 2-rank runs (parameters identical across ranks with every hook) are in test_comm_torchrun.py."""
import contextlib

import pytest
import torch
import torch.distributed as dist

from vlmdata_pipelines.comm import CommOptions, attach_comm_hook, must_sync_every_micro_batch, wrap_ddp
from vlmdata_pipelines.model import TinyVLM, VLMConfig
from vlmdata_pipelines.packs import synthetic_pack
from vlmdata_pipelines.train import TrainConfig, check_options, init_distributed


@pytest.fixture
def group():
    info = init_distributed()
    yield info
    dist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    return TinyVLM(VLMConfig.tiny())


def _steps(ddp, counter, steps: int, accum: int = 2) -> list[int]:
    """Train `steps` optimizer steps of `accum` micro-batches (no_sync on all but the last)."""
    cfg = ddp.module.cfg
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    per_step = []
    for s in range(steps):
        for i in range(accum):
            pack = synthetic_pack([30, 20], [1, 0], cfg, 28, seed=10 * s + i)
            last = i == accum - 1
            ctx = contextlib.nullcontext() if last or must_sync_every_micro_batch(ddp) else ddp.no_sync()
            with ctx:
                loss, _ = ddp(pack)
                loss.backward()
        opt.step()
        opt.zero_grad()
        per_step.append(counter.take())
    return per_step


def _powersgd_elements(model: torch.nn.Module, rank: int, min_rate: float = 2.0) -> int:
    """Elements PowerSGD all-reduces per step: P and Q for matrices worth compressing, the rest as is."""
    total = 0
    for p in model.parameters():
        n = p.shape[0]
        m = p.numel() // n
        r = min(n, m, rank)
        total += (n + m) * r if (n + m) * r * min_rate < n * m else n * m
    return total


@pytest.mark.parametrize("hook,itemsize", [("none", 4), ("bf16", 2), ("fp16", 2)])
def test_plain_and_half_precision_hooks_count_every_gradient_once_per_step(group, hook, itemsize):
    ddp, counter = wrap_ddp(_model(), None, CommOptions(hook=hook, bucket_mb=0.05))
    params = sum(p.numel() for p in ddp.parameters())
    per_step = _steps(ddp, counter, steps=3, accum=2)
    assert per_step == [params * itemsize] * 3  # no_sync micro-batches send nothing
    assert counter.total_bytes == 3 * params * itemsize and counter.calls > 3  # several buckets


def test_powersgd_counts_full_buckets_in_warm_up_then_the_factors(group):
    model = _model()
    ddp, counter = wrap_ddp(model, None, CommOptions(hook="powersgd", bucket_mb=0.05, powersgd_rank=2,
                                                     powersgd_start_iter=2))
    params = sum(p.numel() for p in model.parameters())
    per_step = _steps(ddp, counter, steps=4, accum=2)
    compressed = 4 * _powersgd_elements(model, rank=2)
    assert per_step == [4 * params, 4 * params, compressed, compressed]
    assert compressed < 0.1 * 4 * params


def test_static_graph_syncs_every_micro_batch_of_the_first_step_only(group):
    ddp, counter = wrap_ddp(_model(), None, CommOptions(hook="none", static_graph=True))
    params = sum(p.numel() for p in ddp.parameters())
    assert must_sync_every_micro_batch(ddp)
    per_step = _steps(ddp, counter, steps=3, accum=2)
    assert not must_sync_every_micro_batch(ddp)
    assert per_step == [2 * 4 * params, 4 * params, 4 * params]
    plain, _ = wrap_ddp(_model(), None, CommOptions())
    assert not must_sync_every_micro_batch(plain) and not must_sync_every_micro_batch(_model())


def test_attach_comm_hook_only_on_ddp(group):
    assert attach_comm_hook(_model(), CommOptions(hook="bf16")) is None
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(_model(), bucket_cap_mb=0.05)
    counter = attach_comm_hook(ddp, CommOptions(hook="bf16"))
    assert _steps(ddp, counter, steps=1, accum=1) == [2 * sum(p.numel() for p in ddp.parameters())]


@pytest.mark.parametrize("opts,match", [
    (CommOptions(hook="int8"), "unknown --comm-hook 'int8'"),
    (CommOptions(bucket_mb=0), "--ddp-bucket-mb"),
    (CommOptions(hook="powersgd", powersgd_rank=0), "--powersgd-rank"),
    (CommOptions(hook="powersgd", powersgd_start_iter=1), "--powersgd-start-iter must be >= 2"),
])
def test_bad_options_say_what_to_change(opts, match):
    with pytest.raises(ValueError, match=match):
        opts.validate()


def test_fsdp_refuses_ddp_options():
    with pytest.raises(ValueError, match="drop them or drop --fsdp"):
        check_options(TrainConfig(fsdp=True, comm=CommOptions(hook="bf16")))
    check_options(TrainConfig(fsdp=True))  # defaults are fine
