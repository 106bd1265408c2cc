"""Checkpoints of model, optimizer and every rank's data-loader state.

Layout under the checkpoint directory:

    step_000012/            torch.distributed.checkpoint (DCP) files of model + optimizer
    step_000012/train.json  {"step", "world_size", "data": [state of rank 0, rank 1, ...], "extra"}
    latest                  the name of the newest complete checkpoint

DCP works for DDP and FSDP2 alike (each rank writes its shards; a resumed run
may even use another sharding). A checkpoint is written into a temporary
directory, renamed into place by rank 0 after every rank finished, and only
then named by `latest`, so a crash never leaves a torn checkpoint in use.
"""
from __future__ import annotations

import json
import os
import shutil

import torch
import torch.distributed as dist

from vlmdata import fsutil

# torch.distributed.checkpoint is imported inside the functions: it costs seconds of start-up
# and most runs never checkpoint.

LATEST = "latest"
TRAIN_STATE = "train.json"


def _step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step_{step:06d}")


def save_checkpoint(root: str, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    data_state: dict, extra: dict | None = None) -> str:
    """Collective: every rank calls it. Returns the checkpoint directory."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    rank, world = dist.get_rank(), dist.get_world_size()
    final = _step_dir(root, step)
    tmp = os.path.join(root, f".tmp-step_{step:06d}")
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    states: list = [None] * world
    dist.all_gather_object(states, data_state)  # also orders the mkdir before the writes
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp)
    dist.barrier()
    if rank == 0:
        meta = {"step": step, "world_size": world, "data": states, "extra": extra or {}}
        fsutil.atomic_write_bytes(os.path.join(tmp, TRAIN_STATE), json.dumps(meta, indent=1).encode())
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        fsutil.atomic_write_bytes(os.path.join(root, LATEST), os.path.basename(final).encode())
    dist.barrier()
    return final


def latest_checkpoint(root: str) -> str | None:
    """The newest complete checkpoint directory under `root`, or None."""
    marker = os.path.join(root, LATEST)
    if not os.path.exists(marker):
        return None
    with open(marker) as f:
        name = f.read().strip()
    path = os.path.join(root, name)
    return path if os.path.exists(os.path.join(path, TRAIN_STATE)) else None


def load_checkpoint(path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Collective: restores model and optimizer in place; returns this rank's train state.

    The returned dict has "step", "data" (this rank's data state) and "extra".
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    with open(os.path.join(path, TRAIN_STATE)) as f:
        meta = json.load(f)
    world = dist.get_world_size()
    if meta["world_size"] != world:
        raise ValueError(f"checkpoint {path} was written by {meta['world_size']} ranks; resume it with the same "
                         f"number of ranks (got {world})")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return {"step": int(meta["step"]), "data": meta["data"][dist.get_rank()], "extra": meta.get("extra", {})}
