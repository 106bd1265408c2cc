"""Fixtures shared across test packages: small generated corpora, and an in-process cache daemon.

Helpers (plain functions and classes) live in tests/helpers; the repository root is
tests.helpers.paths.REPO.
"""
from __future__ import annotations

import gc
import os
import tempfile
from pathlib import Path

import pytest

from tests.helpers.corpus import generate_corpus


@pytest.fixture(scope="session")
def small_llava_corpus(tmp_path_factory) -> Path:
    """120 LLaVA-style samples, no corruption."""
    return generate_corpus(tmp_path_factory.mktemp("llava"), samples=120, seed=1)


@pytest.fixture(scope="session")
def corrupt_llava_corpus(tmp_path_factory) -> Path:
    """150 LLaVA-style samples with ~15 % corrupt entries (ids in corrupt.json)."""
    return generate_corpus(tmp_path_factory.mktemp("llava_bad"), samples=150, seed=2, corrupt=0.15)


@pytest.fixture
def frozen_heap():
    """The objects alive before the test kept out of the garbage collector's passes during it (`gc.freeze`).

    Late in the suite the process holds millions of long-lived objects (transformers' modules, earlier tests'
    caches); every `gc.collect()` walks them (the tuner collects before each measurement) and a forked
    worker's collections touch, and so copy, all their pages. The test's own objects are collected as usual;
    the frozen ones go back to the collector afterwards."""
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture
def daemon(tmp_path):
    """A started in-process CacheDaemon: a short Unix socket path (AF_UNIX limit) and a loopback TCP port."""
    from tests.helpers.cache import FAST_RETRY
    from vlmdata.cache.daemon import CacheDaemon, DaemonOptions

    sockdir = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp"))  # short path (AF_UNIX limit)
    opts = DaemonOptions(cache_dir=str(tmp_path / "ssd"), disk_bytes=1 << 24, socket_path=str(sockdir / "d.sock"),
                         tcp_port=0, prefetch_bytes=0, retry=FAST_RETRY)
    d = CacheDaemon(opts)
    d.start()
    yield d
    d.stop()
    os.rmdir(sockdir)
