"""`accelerate launch` with 2 processes (CPU, gloo) trains a tiny model of every native family and of the generic
family through `vlmdata_pipelines.hf_trainer`: each rank trains its own samples, no sample on both ranks, every
sample of the dataset once per epoch, finite losses. (Qwen2-VL and InternVL have their own launch tests in
tests/hf/test_trainer.py and tests/hf/test_internvl.py.)"""
from __future__ import annotations

import json
import math

import pytest

from tests.helpers.hf import (
    BYTE_IMAGE,
    BYTE_VOCAB,
    accelerate_launch,
    byte_corpus_qwen_ids,
    write_llava_folder,
    write_onevision_folder,
    write_qwen2_5_folder,
    write_qwen3_folder,
)
from tests.helpers.idefics3 import write_tiny_folder
from tests.helpers.models import shard_reference_rows
from tests.helpers.train import make_dataset
from vlmdata import Manifest


def _runs(root) -> dict[str, tuple[str, str, int]]:
    """family (as ModelSpec names it) -> (dataset, model folder, max tokens per pack)."""
    from vlmdata.testing import gemma3_folder, llava_next_folder

    byte_data = make_dataset(str(root / "bytes"), samples=16, seed=3, shard_size=4)
    gemma = gemma3_folder(root / "gemma3", image_size=224, tokens_per_image=16, tiny=True, sliding_window=24)
    tiled = {"llava-onevision": write_onevision_folder(str(root / "onevision")),
             "gemma3": gemma,
             "idefics3": write_tiny_folder(str(root / "idefics3"), "idefics3"),
             "smolvlm": write_tiny_folder(str(root / "smolvlm"), "smolvlm"),
             "generic": llava_next_folder(root / "llava_next", side=56)}
    runs = {"qwen2.5-vl": (byte_data, write_qwen2_5_folder(str(root / "qwen25"), ids=byte_corpus_qwen_ids(),
                                                           vocab_size=BYTE_VOCAB), 1024),
            "qwen3-vl": (byte_data, write_qwen3_folder(str(root / "qwen3"), ids=byte_corpus_qwen_ids(),
                                                       vocab_size=BYTE_VOCAB), 1024),
            "llava": (byte_data, write_llava_folder(str(root / "llava"), vocab_size=BYTE_VOCAB,
                                                    image_token_id=BYTE_IMAGE, image_size=56), 1024)}
    for family, folder in tiled.items():
        data = shard_reference_rows(root / f"data-{family}", folder, max_samples_per_shard=4).dataset
        runs[family] = (str(data), str(folder), 4096)
    return runs


@pytest.mark.integration
@pytest.mark.slow
def test_accelerate_launch_trains_every_family(tmp_path):
    from vlmdata.hf import ModelSpec

    runs = _runs(tmp_path)
    for family, (_, folder, _) in runs.items():
        assert ModelSpec.from_folder(folder).family == family
    plan = [{"data": data, "model": folder, "out": str(tmp_path / "out" / family), "max_tokens": tokens}
            for family, (data, folder, tokens) in runs.items()]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    accelerate_launch(["tests/helpers/accelerate_runs.py", str(tmp_path / "plan.json")],
                      timeout=900)
    for family, (data, _, _) in runs.items():
        results = [json.loads((tmp_path / "out" / family / f"result.rank{r}.json").read_text()) for r in range(2)]
        keys = [set(r["keys_by_epoch"]["0"]) for r in results]
        samples = Manifest.load(data).num_samples
        assert all(keys) and not keys[0] & keys[1], family                 # both ranks trained, no sample twice
        assert len(keys[0]) + len(keys[1]) == samples, family              # every sample once in the epoch
        assert all(r["world_size"] == 2 for r in results), family
        assert all(math.isfinite(x) for r in results for x in r["losses"]) and results[0]["losses"], family
