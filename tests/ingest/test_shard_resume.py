"""A killed `vlmdata shard` leaves no torn shard, and `--resume` completes it to the same bytes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time

from tests.helpers.shards import read_jsonl, shard, tar_tree
from vlmdata.formats import Manifest


def _wait_for(cond, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)


def test_killed_run_resumes_to_identical_output(corrupt_llava_corpus, tmp_path):
    rows = read_jsonl(corrupt_llava_corpus / "data.jsonl")[:60]
    for r in rows:
        r["images"] = [str(corrupt_llava_corpus / p) for p in r["images"]]
    lines = [json.dumps(r) + "\n" for r in rows]
    data = tmp_path / "data.jsonl"
    os.mkfifo(data)
    out = tmp_path / "out"
    root = str(corrupt_llava_corpus)   # the rows name absolute paths there: the image root
    cmd = [sys.executable, "-m", "vlmdata", "shard", str(data), "-o", str(out), "--workers", "1",
           "--max-samples-per-shard", "10", "--image-root", root]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def feed() -> None:  # 25 rows: jobs 0 and 1 complete, then the reader blocks on the pipe
        try:
            with open(data, "w") as f:
                f.writelines(lines[:25])
                f.flush()
                _wait_for(lambda: proc.poll() is not None, timeout=300)
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    try:
        _wait_for(lambda: (out / "_jobs" / "job-000001.json").exists() or proc.poll() is not None)
        assert proc.poll() is None, proc.stderr.read().decode()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        writer.join(timeout=60)
    assert not (out / "manifest.json").exists()
    for p in out.iterdir():  # nothing torn under a final name
        if p.suffix == ".tar":
            with tarfile.open(p) as t:
                assert len(t.getmembers()) > 0

    os.unlink(data)
    data.write_text("".join(lines))
    ref = tmp_path / "ref"
    shard(data, ref, max_samples_per_shard=10, image_root=root)

    assert (out / "_jobs" / "job-000000.json").exists() and not (out / "_jobs" / "job-000002.json").exists()
    damaged = out / "shard-000001-00.tar"
    damaged.write_bytes(damaged.read_bytes()[:-1024])  # a committed job whose shard was damaged since
    m = shard(data, out, max_samples_per_shard=10, resume=True, workers=2, image_root=root)
    assert m.stats["resumed_jobs"] == 1 and m.stats["jobs"] == 6
    assert tar_tree(out) == tar_tree(ref)
    ref_m = Manifest.load(str(ref))
    assert m.shards == ref_m.shards
    assert m.stats["skipped"] == ref_m.stats["skipped"]
    again = shard(data, out, max_samples_per_shard=10, resume=True, image_root=root)
    assert again.stats["resumed_jobs"] == 6 and tar_tree(out) == tar_tree(ref)
