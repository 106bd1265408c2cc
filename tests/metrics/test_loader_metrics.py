"""LoaderMetrics and `instrument`: data-wait and step timing measured exactly (a fake clock), and with the real one."""
from __future__ import annotations

import pytest

from tests.helpers.metrics import registry_value as value
from vlmdata.metrics import LoaderMetrics, MetricSet, StatsDelta, instrument


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_loader_metrics_measures_wait_and_steps_exactly():
    clock = FakeClock()

    def batches():  # each batch takes 2 s to produce; stats ride along
        for i in range(3):
            clock.now += 2.0
            yield {"stats": StatsDelta(samples=i + 1, packs=1).to_dict()}

    ms = MetricSet()
    for _ in LoaderMetrics(batches(), ms, rank=0, clock=clock):
        clock.now += 1.0  # the training step's own work
    assert value(ms, "vlmdata_data_wait_seconds_total", rank="0") == pytest.approx(6.0)
    assert value(ms, "vlmdata_step_seconds_total", rank="0") == pytest.approx(9.0)
    assert value(ms, "vlmdata_steps_total", rank="0") == 3
    assert value(ms, "vlmdata_step_duration_seconds_count", rank="0") == 3
    assert value(ms, "vlmdata_samples_total", rank="0") == 6
    assert value(ms, "vlmdata_packs_total", rank="0") == 3


def test_loader_metrics_early_break_closes_last_step():
    clock = FakeClock()

    def batches():
        while True:
            clock.now += 0.5
            yield {"x": 1}  # no stats: nothing absorbed, timing still measured

    ms = MetricSet()
    it = LoaderMetrics(batches(), ms, rank="2", clock=clock)
    for n, _ in enumerate(it, 1):
        clock.now += 1.5
        if n == 4:
            break
    assert value(ms, "vlmdata_steps_total", rank="2") == 4
    assert value(ms, "vlmdata_step_seconds_total", rank="2") == pytest.approx(8.0)
    assert value(ms, "vlmdata_data_wait_seconds_total", rank="2") == pytest.approx(2.0)
    assert value(ms, "vlmdata_samples_total", rank="2") is None


def test_instrument_wraps_with_real_clock():
    ms = MetricSet()
    got = list(instrument([{"stats": StatsDelta(images=2).to_dict()}, {"stats": StatsDelta(images=3)}], ms, 0))
    assert len(got) == 2
    assert value(ms, "vlmdata_images_total", rank="0") == 5
    assert value(ms, "vlmdata_steps_total", rank="0") == 2
    wait = value(ms, "vlmdata_data_wait_seconds_total", rank="0")
    assert 0 <= wait <= value(ms, "vlmdata_step_seconds_total", rank="0")


def test_a_scrape_never_sees_more_wait_than_step_time():
    """A wait is counted with the step it belongs to, so rate(wait) / rate(step) stays within [0, 1]
    whenever the counters are read (the dashboard's data-wait fraction)."""
    clock = FakeClock()

    def batches():          # the first batch is a 5 s cold start, the rest 0.5 s
        for i in range(4):
            clock.now += 5.0 if i == 0 else 0.5
            yield {"stats": StatsDelta(packs=1).to_dict()}

    ms = MetricSet()
    seen = []
    for _ in LoaderMetrics(batches(), ms, rank=0, clock=clock):
        seen.append((value(ms, "vlmdata_data_wait_seconds_total", rank="0") or 0.0,
                     value(ms, "vlmdata_step_seconds_total", rank="0") or 0.0))
        clock.now += 1.0
    assert seen[0] == (0.0, 0.0)                        # the first wait is not counted before its step ends
    assert all(w <= s for w, s in seen)
    assert value(ms, "vlmdata_data_wait_seconds_total", rank="0") == pytest.approx(6.5)
    assert value(ms, "vlmdata_step_seconds_total", rank="0") == pytest.approx(10.5)
