"""The tuner's tests measure real DataLoaders: they run with the earlier tests' objects frozen (see
tests/conftest.py `frozen_heap`), so a long suite's heap does not slow each measurement's collection and fork."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _measure_on_a_frozen_heap(frozen_heap):
    yield
