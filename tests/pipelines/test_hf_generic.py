"""The generic family (a LLaVA-NeXT folder: vlmdata has no native LLaVA-NeXT family) in the reference loop
(`vlmdata_pipelines.train --model hf:DIR`): the probe pack is the processor's own image (float pixel_values
[images, patches, 3, S, S], image_sizes), normalised by the processor whatever its mean/std, the images of a
pack are counted per image (not per patch), and a tiny LLaVA-NeXT trains from the command line with 2 DataLoader
workers."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers.models import shard_reference_rows
from tests.helpers.paths import REPO
from tests.helpers.train import text_only_step
from vlmdata import VLMDataset
from vlmdata.testing import llava_next_folder
from vlmdata_pipelines.hf_model import HFModelConfig, HFPackedModel
from vlmdata_pipelines.train import image_count


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """(folder, dataset, images per sample key) of the reference corpus sharded with a LLaVA-NeXT folder whose
    image processor normalises with mean/std 0.5 (not CLIP's)."""
    root = tmp_path_factory.mktemp("generic")
    folder = str(llava_next_folder(root / "model", side=56, image_mean=[0.5] * 3, image_std=[0.5] * 3))
    _, expected, dataset = shard_reference_rows(root, folder)
    images = {f"conv{n}": len(ims) for n, (_, ims) in enumerate(expected)}
    return folder, str(dataset), images


def test_the_probe_pack_is_the_processors_image(data):
    folder, _, _ = data
    wrapped = HFPackedModel(HFModelConfig(folder, "vlmdata_varlen"))    # its dry run: the probe pack, trained
    probe = wrapped._probe_pack()
    pixels = probe["pixel_values"]
    assert pixels.dtype == torch.float32 and pixels.dim() == 5 and pixels.shape[0] == 1 and pixels.shape[-1] == 56
    assert pixels.min() < 0                                   # normalised by the processor (black: -1 at mean 0.5)
    assert probe["processor_image_sizes"].tolist() == [[28, 28]]
    run = (probe["input_ids"] == wrapped.spec.image_token_id).sum()
    assert int(run) == int(wrapped.spec.image_policy().tokens([28], [28])[0])
    assert image_count(probe) == 1
    assert text_only_step(wrapped) == ([], 5)                # a text-only pack still reaches the vision tower


def test_images_are_counted_per_image(data):
    _, ds_dir, images = data
    ds = VLMDataset(ds_dir, max_tokens=1 << 16, rank=0, world_size=1)
    pack = next(iter(ds))
    want = sum(images[k] for k in pack["sample_keys"])
    patches = pack["pixel_values"].shape[0] * pack["pixel_values"].shape[1]
    assert want >= 2 and patches > want
    assert image_count(pack) == want
    assert image_count({k: v for k, v in pack.items() if k != "stats"}) == want        # from the tensors alone


@pytest.mark.slow
def test_train_llava_next_from_the_command_line(data, tmp_path):
    folder, ds_dir, images = data
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "vlmdata_pipelines.train", "--data", ds_dir, "--model", f"hf:{folder}",
           "--steps", "6", "--max-tokens", "1024", "--num-workers", "2", "--lr", "3e-3", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.load(open(out / "result.rank0.json"))
    losses = result["losses"]
    assert result["steps"] == list(range(6)) and all(math.isfinite(x) for x in losses)
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.2, losses
    assert 0 < result["images"] <= 6 * sum(images.values())
