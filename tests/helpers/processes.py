"""Subprocesses that must not outlive their test."""
from __future__ import annotations

import os
import signal
import subprocess


def run_group(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run in a new session; on timeout the whole process group is killed.

    torchrun and similar launchers leave their workers running when only the
    launcher is killed; this keeps a timed-out test from leaking them.
    """
    with subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"{cmd[:4]}... timed out after {timeout}s\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
