"""Rank and world size from torch.distributed under a real torchrun: exactly once, equal step counts."""
import json
import os
import sys

import pytest

from tests.helpers.dataset import make_samples, write_dataset
from tests.helpers.processes import run_group

pytestmark = pytest.mark.integration  # torchrun

SCRIPT = r'''
import json, os, sys
import torch.distributed as dist
from vlmdata.loading import DatasetOptions, VLMDataset, make_loader
dist.init_process_group("gloo")
ds = VLMDataset(sys.argv[1], max_tokens=512, max_images=6, image_size=56,
                options=DatasetOptions(window_shards=2))
assert (ds.rank, ds.world_size) == (dist.get_rank(), dist.get_world_size())
steps = [b["sample_keys"] for b in make_loader(ds, num_workers=2)]
with open(os.path.join(sys.argv[2], f"rank{ds.rank}.json"), "w") as f:
    json.dump(steps, f)
dist.barrier()
dist.destroy_process_group()
'''


@pytest.mark.slow
def test_torchrun_two_ranks(tmp_path):
    root = str(tmp_path / "ds")
    samples = make_samples(40, seed=3)
    write_dataset(root, samples, shard_size=8)
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(script), root, str(tmp_path)]
    proc = run_group(cmd, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert len(steps[0]) == len(steps[1]) > 0
    keys = [k for rank in steps for pack in rank for k in pack]
    assert sorted(keys) == sorted(s.key for s in samples)
