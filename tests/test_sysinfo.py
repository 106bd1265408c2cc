"""Worker processes die with their parent, even when it is killed with SIGKILL."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil

POOL = r"""
import os, sys
from concurrent.futures import ProcessPoolExecutor
import psutil
from vlmdata.sysinfo import die_with_parent

pool = ProcessPoolExecutor(2, initializer=die_with_parent if sys.argv[1] == "yes" else None)
pool.submit(os.getpid).result()
while len(psutil.Process().children()) < 2:
    pool.submit(os.getpid).result()
print(" ".join(str(c.pid) for c in psutil.Process().children()), flush=True)
sys.stdin.read()          # until the test kills us
"""


def _workers_after_kill(die: str, wait: float) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """Start a pool in a child process, SIGKILL that process, and return its workers (gone, alive) once all
    are gone or `wait` seconds on."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", POOL, die], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    line = proc.stdout.readline()
    workers = [psutil.Process(int(p)) for p in line.split()]
    assert len(workers) == 2, line
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return psutil.wait_procs(workers, timeout=wait)


def test_pool_workers_die_with_a_killed_parent():
    gone, alive = _workers_after_kill("yes", wait=30)
    assert alive == [] and len(gone) == 2
    gone, alive = _workers_after_kill("no", wait=2)   # the control: without it they are orphans that stay
    try:
        assert len(alive) == 2
    finally:
        for p in alive:
            p.kill()
