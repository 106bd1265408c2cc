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



def test_cli_bar_moves_within_jobs_on_a_tty(small_llava_corpus, tmp_path):
    """`vlmdata shard` on a terminal: the bar shows counts between job boundaries (2 jobs of 60 rows)."""
    import fcntl
    import os
    import pty
    import re
    import struct
    import subprocess
    import sys
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # tqdm needs a width
    cmd = [sys.executable, "-m", "vlmdata", "shard", str(small_llava_corpus / "data.jsonl"), "-o",
           str(tmp_path / "out"), "--workers", "2", "--max-samples-per-shard", "60", "--progress-interval", "0"]
    env = {**os.environ, "TQDM_MININTERVAL": "0", "TQDM_MINITERS": "1"}  # draw every update
    proc = subprocess.Popen(cmd, stderr=slave, stdout=subprocess.PIPE, env=env)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(120) == 0
    assert b"-> 120 samples" in proc.stdout.read()
    proc.stdout.close()
    counts = {int(x) for x in re.findall(rb"\r *(\d+) samples", out)}
    assert 120 in counts
    assert any(c % 60 for c in counts), counts  # a count inside a job, not only at job ends
