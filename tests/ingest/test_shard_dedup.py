"""Dedup at shard time: across two datasets (--dedup-against), within the run, and a killed run resumed to the
same decisions; every input row is written or skipped under a reason."""
from __future__ import annotations

import json
from functools import partial

import pytest

from tests.helpers.shards import read_jsonl, shard
from vlmdata.errors import ConfigError
from vlmdata.formats import SampleIndex
from vlmdata.ingest import shard_dataset
from vlmdata.keyindex import open_dataset_keys


def keys_of(out, manifest):
    return [k for s in manifest.shards for k in SampleIndex.load(str(out / s.index)).keys()]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def rows(small_llava_corpus):
    rows = read_jsonl(small_llava_corpus / "data.jsonl")
    for r in rows:
        r["images"] = [str(small_llava_corpus / p) for p in r["images"]]
        if "image" in r:
            r["image"] = str(small_llava_corpus / r["image"])
    return rows


@pytest.fixture
def sh(small_llava_corpus):
    """`shard` reading images under the corpus (the rows name them by absolute path)."""
    return partial(shard, image_root=str(small_llava_corpus))


def test_second_dataset_skips_keys_of_the_first_and_its_own_repeats(rows, sh, tmp_path):
    a = sh(write_rows(tmp_path / "a.jsonl", rows[:70]), tmp_path / "a", max_samples_per_shard=20)
    b_rows = rows[40:] + rows[100:110]                     # 30 rows of A, 10 repeats inside B
    b = sh(write_rows(tmp_path / "b.jsonl", b_rows), tmp_path / "b", max_samples_per_shard=20,
              dedup_against=[str(tmp_path / "a")])
    assert b.stats["skipped"] == {"duplicate_in_dataset": 30, "duplicate_key": 10}
    assert b.stats["examples"]["duplicate_in_dataset"]["detail"].endswith(f"is already in {tmp_path / 'a'}")
    assert b.stats["input_rows"] == len(b_rows) == b.num_samples + b.stats["skipped_total"]
    keys_a, keys_b = keys_of(tmp_path / "a", a), keys_of(tmp_path / "b", b)
    assert not set(keys_a) & set(keys_b)
    assert sorted(keys_a + keys_b) == sorted(r["id"] for r in rows)
    assert b.stats["dedup_against"] == [str(tmp_path / "a")]
    assert len(open_dataset_keys(str(tmp_path / "b"))) == 50


def test_dedup_against_a_dataset_without_usable_keys_is_a_config_error(rows, tmp_path):
    from vlmdata.ingest import ShardConfig

    data = write_rows(tmp_path / "d.jsonl", rows[:5])
    with pytest.raises(ConfigError, match="--dedup-against .*missing"):
        shard_dataset(ShardConfig(inputs=[str(data)], output=str(tmp_path / "o"), workers=0,
                                  dedup_against=[str(tmp_path / "missing")]))


def test_all_rows_known_elsewhere_is_a_clear_empty_run(rows, sh, tmp_path):
    data = write_rows(tmp_path / "a.jsonl", rows[:10])
    sh(data, tmp_path / "a")
    with pytest.raises(ConfigError, match="every row is a duplicate"):
        sh(data, tmp_path / "b", dedup_against=[str(tmp_path / "a")])
    assert not (tmp_path / "b" / "_jobs").exists()


def test_a_crashed_run_resumes_with_its_dedup_file(rows, sh, tmp_path, monkeypatch):
    import vlmdata.ingest.job as job_module

    data = write_rows(tmp_path / "d.jsonl", rows[:50] + rows[5:15] + rows[50:60])
    whole = sh(data, tmp_path / "whole", max_samples_per_shard=10)
    real = job_module.run_job

    def crash_at_job_4(spec, opts, report=None):
        if spec.job == 4:
            raise RuntimeError("killed")
        return real(spec, opts, report)

    monkeypatch.setattr(job_module, "run_job", crash_at_job_4)
    monkeypatch.setattr("vlmdata.ingest.engine.run_job", crash_at_job_4)
    with pytest.raises(RuntimeError, match="killed"):
        sh(data, tmp_path / "out", max_samples_per_shard=10)
    assert not (tmp_path / "out" / "_jobs" / "seen-keys").exists()       # a resumed run rebuilds it
    monkeypatch.undo()
    resumed = sh(data, tmp_path / "out", max_samples_per_shard=10, resume=True)
    assert resumed.stats["skipped"] == whole.stats["skipped"] == {"duplicate_key": 10}
    assert resumed.stats["resumed_jobs"] == 4
    assert keys_of(tmp_path / "out", resumed) == keys_of(tmp_path / "whole", whole)
