"""`vlmdata shard` and `vlmdata inspect` as commands: summary lines, and a progress bar that moves within jobs on
a terminal."""
from __future__ import annotations

import subprocess
import sys

from vlmdata.formats import Manifest


def test_cli_shard_and_inspect(corrupt_llava_corpus, tmp_path):
    out = tmp_path / "cli"
    r = subprocess.run([sys.executable, "-m", "vlmdata", "shard", str(corrupt_llava_corpus / "data.jsonl"),
                        "-o", str(out), "--workers", "1", "--max-samples-per-shard", "100"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    line, lengths = r.stdout.strip().splitlines()[-2:]     # the summary, then the sample lengths
    m = Manifest.load(str(out))
    assert lengths.startswith("lengths: longest sample ")
    assert line.startswith(f"sharded 150 rows -> {m.num_samples} samples") and "2 shards" in line
    r = subprocess.run([sys.executable, "-m", "vlmdata", "inspect", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and "skipped samples by reason" in r.stdout


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
