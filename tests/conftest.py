"""Shared test fixtures: where the corpus generator lives, and small generated corpora."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vlmdata.testing import require_gen_raw


def gen_raw_path() -> Path:
    """../shared/bench/gen_raw.py next to the checkout (VLMDATA_GEN_RAW overrides)."""
    return Path(require_gen_raw())


def generate_corpus(out: Path, samples: int, seed: int = 0, fmt: str = "llava", corrupt: float = 0.0) -> Path:
    """Run gen_raw.py into `out` and return it."""
    cmd = [sys.executable, str(gen_raw_path()), str(out), "--samples", str(samples), "--seed", str(seed),
           "--format", fmt, "--corrupt", str(corrupt)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def small_llava_corpus(tmp_path_factory) -> Path:
    """120 LLaVA-style samples, no corruption."""
    return generate_corpus(tmp_path_factory.mktemp("llava"), samples=120, seed=1)


@pytest.fixture(scope="session")
def corrupt_llava_corpus(tmp_path_factory) -> Path:
    """150 LLaVA-style samples with ~15 % corrupt entries (ids in corrupt.json)."""
    return generate_corpus(tmp_path_factory.mktemp("llava_bad"), samples=150, seed=2, corrupt=0.15)


def run_group(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run in a new session; on timeout the whole process group is killed.

    torchrun and similar launchers leave their workers running when only the
    launcher is killed; this keeps a timed-out test from leaking them.
    """
    import signal

    with subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"{cmd[:4]}... timed out after {timeout}s\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
