"""`--engine ray` runs the same jobs on a local Ray instance and writes the same bytes (and the same skip
examples, one per reason)."""
from __future__ import annotations

import json

import pytest

from tests.helpers.shards import read_jsonl, shard, tar_tree

pytestmark = pytest.mark.integration  # a local Ray instance


@pytest.mark.slow
def test_ray_engine_matches_local(corrupt_llava_corpus, tmp_path):
    import ray

    rows = read_jsonl(corrupt_llava_corpus / "data.jsonl")[:40]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    root = str(corrupt_llava_corpus)        # the rows' relative image paths resolve there
    local = shard(data, tmp_path / "local", max_samples_per_shard=10, image_root=root)
    assert local.num_samples > 30 and "outside_root" not in local.stats["skipped"]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        m = shard(data, tmp_path / "ray", engine="ray", workers=2, max_samples_per_shard=10, image_root=root)
    finally:
        ray.shutdown()
    assert m.stats["engine"] == "ray" and m.stats["jobs"] == 4
    assert m.shards == local.shards and m.stats["skipped"] == local.stats["skipped"]
    assert m.stats["examples"] == local.stats["examples"] and set(m.stats["examples"]) == set(m.stats["skipped"])
    assert tar_tree(tmp_path / "ray") == tar_tree(tmp_path / "local")
