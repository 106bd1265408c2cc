"""Helpers for the tests of the reference training application (vlmdata_pipelines/): a learnable sharded corpus, packs
from it, gradients, torchrun."""
from __future__ import annotations

import os
import subprocess
import sys

import torch

from tests.helpers.paths import REPO
from tests.helpers.processes import run_group
from vlmdata_pipelines.model import TinyVLM
from vlmdata_pipelines.packs import split_pack


def make_dataset(root: str, samples: int = 120, seed: int = 0, shard_size: int = 40) -> str:
    """Generate the learnable corpus (vlmdata_pipelines.corpus) and shard it with vlmdata.ingest; returns the dataset dir."""
    from vlmdata.ingest import ShardConfig, shard_dataset
    from vlmdata_pipelines.corpus import generate

    raw, out = os.path.join(root, "raw"), os.path.join(root, "ds")
    generate(raw, samples, seed)
    shard_dataset(ShardConfig(inputs=[os.path.join(raw, "data.jsonl")], output=out,
                              max_samples_per_shard=shard_size, workers=1))
    return out


def load_packs(data: str, count: int, max_tokens: int = 512, image_size=28, rank: int = 0,
               world_size: int = 1, seed: int = 0) -> list[dict]:
    """The first `count` packs of a rank, read in-process (no DataLoader workers)."""
    from vlmdata_pipelines.data import DataOptions

    opts = DataOptions(data=data, max_tokens=max_tokens, image_size=image_size, seed=seed)
    from vlmdata.loading import VLMDataset

    ds = VLMDataset(data, seed=seed, max_tokens=max_tokens, max_images=opts.max_images, image_size=opts.policy(),
                    rank=rank, world_size=world_size, decoder="pillow")
    ds.set_epoch(0)
    packs = []
    for batch in ds:
        packs.append(batch)
        if len(packs) == count:
            break
    return packs


def grads_of(model: TinyVLM, batches: list[dict]) -> tuple[torch.Tensor, int, dict[str, torch.Tensor]]:
    """Summed loss, label count and gradients of the summed loss over `batches`."""
    model.zero_grad(set_to_none=True)
    total, count = torch.zeros((), dtype=torch.float64), 0
    for b in batches:
        loss, n = model(b)
        loss.backward()
        total = total + loss.detach().double().cpu()
        count += int(n)
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
    return total, count, grads


def assert_grads_close(a: dict, b: dict, rel: float = 1e-5) -> None:
    """Every parameter's gradients agree to `rel` of that parameter's largest gradient."""
    assert a.keys() == b.keys()
    for name in a:
        scale = float(a[name].abs().max()) + 1e-12
        err = float((a[name] - b[name]).abs().max())
        assert err <= rel * scale + 1e-9, f"{name}: max abs diff {err:.3e} vs scale {scale:.3e}"


def one_by_one(model: TinyVLM, pack: dict) -> list[dict]:
    cfg = model.cfg
    return split_pack(pack, cfg.image_token_id, cfg.patch, cfg.merge)


def torchrun(args: list[str], timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m torch.distributed.run ARGS` from the repo root (no shell); raises with output on failure."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **(env or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", *args]
    proc = run_group(cmd, timeout=timeout, cwd=REPO, env=full_env)
    if proc.returncode != 0:
        raise AssertionError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def text_only_step(wrapped, ids=(1, 2, 3, 4, 5, 6)) -> tuple[list[str], int]:
    """One backward pass of a text-only pack through an HFPackedModel: (trainable parameters left without a
    gradient, label tokens counted). A pack without images must still reach the vision tower (DDP)."""
    ids = torch.tensor(ids)
    n = len(ids)
    pack = {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(n),
            "cu_seqlens": torch.tensor([0, n], dtype=torch.int32), "max_seqlen": n}
    wrapped.zero_grad(set_to_none=True)
    loss, count = wrapped(pack)
    loss.backward()
    return [name for name, p in wrapped.named_parameters() if p.requires_grad and p.grad is None], int(count)
