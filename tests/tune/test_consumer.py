"""ConsumerLoad keeps the asked CPUs busy in this process without holding the GIL."""
from __future__ import annotations

import threading
import time

import pytest

from vlmdata.tune import ConsumerLoad


def test_zero_cores_runs_nothing():
    with ConsumerLoad(0) as load:
        assert not [t for t in threading.enumerate() if t.name.startswith("vlmdata-consumer")]
    assert load.achieved_cores == 0.0


def test_half_a_core_is_busy_and_python_still_runs():
    with ConsumerLoad(0.5) as load:
        assert len([t for t in threading.enumerate() if t.name.startswith("vlmdata-consumer")]) == 1
        end, n = time.perf_counter() + 0.6, 0
        while time.perf_counter() < end:        # the main thread keeps running Python meanwhile
            n += 1
    assert n > 10_000
    assert 0.2 < load.achieved_cores <= 0.75       # its share of each period even while Python runs, idle the rest
    assert not [t for t in threading.enumerate() if t.name.startswith("vlmdata-consumer")]


def test_negative_is_an_error():
    with pytest.raises(ValueError, match=">= 0"):
        ConsumerLoad(-1)
