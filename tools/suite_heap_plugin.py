"""A pytest plugin for tools/bench_suite_heap.py: gives the test process a late suite's heap.

VLMDATA_BENCH_HEAP_OBJECTS=N keeps N small dicts (each holding a list) alive for the whole run, as the
modules and caches of a long suite do. VLMDATA_BENCH_HEAP_NO_FREEZE=1 makes `gc.freeze`/`gc.unfreeze`
no-ops, so the tests' `frozen_heap` fixture (tests/conftest.py) does nothing: the code before it.
"""
from __future__ import annotations

import gc
import os

_kept: list = []


def pytest_configure(config):
    n = int(os.environ.get("VLMDATA_BENCH_HEAP_OBJECTS", "0"))
    _kept.append([{"k": i, "v": [i]} for i in range(n)])
    if os.environ.get("VLMDATA_BENCH_HEAP_NO_FREEZE") == "1":
        gc.freeze = gc.unfreeze = lambda: None
