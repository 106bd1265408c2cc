"""The Python side of --max-skip-fraction: shard_dataset raises TooManySkipsError after writing, carrying the
manifest and a SkipSummary; one example per reason is collected by pool workers as by inline ones, and survives
--resume; skips asked for with dedup_against do not count."""
from __future__ import annotations

import logging

import pytest

from vlmdata import ShardConfig, shard_dataset
from vlmdata.errors import ConfigError, Skip, TooManySkipsError
from vlmdata.formats import Manifest
from vlmdata.ingest import SkipSummary


def _cfg(corpus, out, **kw) -> ShardConfig:
    return ShardConfig(inputs=[str(corpus / "data.jsonl")], output=str(out), max_samples_per_shard=40, **kw)


def test_too_many_skips_raises_after_writing_with_the_manifest(corrupt_llava_corpus, tmp_path):
    with pytest.raises(TooManySkipsError) as info:
        shard_dataset(_cfg(corrupt_llava_corpus, tmp_path / "a", workers=0, max_skip_fraction=0.05))
    manifest, summary = info.value.result, info.value.summary
    assert manifest.to_json() == Manifest.load(str(tmp_path / "a")).to_json()      # written, complete
    assert summary.rows == 150 and summary.skipped == manifest.stats["skipped"]
    assert summary.counted == manifest.stats["skipped_total"] and summary.fraction > 0.05
    assert str(info.value).startswith(summary.describe())


def test_examples_from_pool_workers_equal_inline_ones_and_survive_resume(corrupt_llava_corpus, tmp_path):
    inline = shard_dataset(_cfg(corrupt_llava_corpus, tmp_path / "inline", workers=0))
    pooled = shard_dataset(_cfg(corrupt_llava_corpus, tmp_path / "pool", workers=2))
    assert inline.stats["jobs"] == 4 and len(inline.stats["skipped"]) >= 3
    assert set(inline.stats["examples"]) == set(inline.stats["skipped"])
    assert pooled.stats["examples"] == inline.stats["examples"]
    (tmp_path / "pool" / "manifest.json").unlink()          # every job is resumed from its stats file
    with pytest.raises(TooManySkipsError) as info:
        shard_dataset(_cfg(corrupt_llava_corpus, tmp_path / "pool", workers=2, resume=True, max_skip_fraction=0.01))
    resumed = info.value.result
    assert resumed.stats["resumed_jobs"] == 4 and resumed.stats["examples"] == inline.stats["examples"]
    assert info.value.summary.describe() == SkipSummary.from_stats(inline.stats).describe()


def test_a_warning_is_logged_from_one_percent(corrupt_llava_corpus, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="vlmdata.ingest.skips"):
        m = shard_dataset(_cfg(corrupt_llava_corpus, tmp_path / "w", workers=0))
    lines = [r.getMessage() for r in caplog.records if r.name == "vlmdata.ingest.skips"]
    assert lines == [SkipSummary.from_stats(m.stats).describe()]


def test_rows_already_in_a_dedup_against_dataset_do_not_count(small_llava_corpus, tmp_path):
    lines = (small_llava_corpus / "data.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "first.jsonl").write_text("".join(lines[:100]))
    shard_dataset(ShardConfig(inputs=[str(tmp_path / "first.jsonl")], output=str(tmp_path / "first"), workers=0,
                              image_root=str(small_llava_corpus)))
    m = shard_dataset(_cfg(small_llava_corpus, tmp_path / "rest", workers=0, max_skip_fraction=0.0,
                           dedup_against=[str(tmp_path / "first")]))
    assert m.stats["skipped"] == {Skip.DUPLICATE_IN_DATASET: 100} and m.num_samples == 20
    summary = SkipSummary.from_stats(m.stats)
    assert summary.counted == 0 and summary.fraction == 0.0


def test_max_skip_fraction_is_checked_before_any_work(small_llava_corpus, tmp_path):
    with pytest.raises(ConfigError, match="--max-skip-fraction must be between 0 and 1"):
        shard_dataset(_cfg(small_llava_corpus, tmp_path / "x", max_skip_fraction=-0.1))
    assert not (tmp_path / "x").exists()
