"""Live sharding progress: per-sample increments from worker processes, adding up to the run's totals."""
from __future__ import annotations

import time


def _record():
    calls: list[tuple[float, int, int]] = []
    return calls, lambda rows, written: calls.append((time.monotonic(), rows, written))


def test_pool_workers_report_while_jobs_run(small_llava_corpus, tmp_path):
    calls, cb = _record()
    from vlmdata.ingest import ShardConfig, shard_dataset

    cfg = ShardConfig(inputs=[str(small_llava_corpus / "data.jsonl")], output=str(tmp_path / "out"),
                      max_samples_per_shard=40, workers=2)
    m = shard_dataset(cfg, progress=cb, progress_interval=0.0)
    assert m.stats["jobs"] == 3 and m.num_samples == 120
    assert sum(c[1] for c in calls) == 120 and sum(c[2] for c in calls) == m.num_samples
    assert all(c[1] >= 0 and c[2] >= 0 for c in calls)
    # far more updates than jobs: the bar moves within a job, not once per job
    assert len(calls) >= 10, calls
    assert sum(1 for c in calls if c[1] == 1) >= 5


def test_inline_run_reports_every_sample_and_throttles(small_llava_corpus, tmp_path):
    calls, cb = _record()
    from vlmdata.ingest import ShardConfig, shard_dataset

    cfg = ShardConfig(inputs=[str(small_llava_corpus / "data.jsonl")], output=str(tmp_path / "a"),
                      max_samples_per_shard=50, workers=0)
    shard_dataset(cfg, progress=cb, progress_interval=0.0)
    assert [c[1] for c in calls] == [1] * 120
    calls2, cb2 = _record()
    cfg.output = str(tmp_path / "b")
    shard_dataset(cfg, progress=cb2, progress_interval=3600.0)  # throttled: one update per finished job
    assert [c[1] for c in calls2] == [50, 50, 20]
