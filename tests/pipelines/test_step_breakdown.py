"""The step breakdown's attribution rules on hand-made timelines (CPU and GPU shapes), and its
extraction from a real profile's events."""
import math

import pytest
import torch
from torch.autograd.profiler import record_function

from vlmdata_pipelines.step_breakdown import (
    PHASES,
    Breakdown,
    StepTimeline,
    attribute,
    breakdown_from_events,
    format_breakdown,
    profiler_events,
    timelines_from_events,
)


def _check_partition(out: dict, span: tuple[float, float]) -> None:
    assert set(out) == set(PHASES)
    assert all(v >= 0 for v in out.values())
    assert math.isclose(sum(out.values()), span[1] - span[0], rel_tol=1e-12)


def test_cpu_step_nested_phases_and_other():
    tl = StepTimeline(span=(0, 1000),
                      phases=[("data_wait", 0, 100), ("decode_stage", 20, 60), ("h2d", 100, 110),
                              ("lm_forward", 110, 500), ("vision_encoder", 150, 250), ("projector", 250, 270),
                              ("backward", 500, 900), ("optimizer", 900, 980)],
                      host_ops=[(110, 500), (500, 900), (900, 980)])
    out = attribute(tl)
    _check_partition(out, tl.span)
    assert out["data_wait"] == 60 and out["decode_stage"] == 40 and out["h2d"] == 10
    assert out["vision_encoder"] == 100 and out["projector"] == 20 and out["lm_forward"] == 390 - 120
    assert out["backward"] == 400 and out["optimizer"] == 80 and out["other"] == 20
    assert out["communication"] == 0


def test_cpu_blocked_wait_on_a_collective_is_communication_short_gaps_are_not():
    # backward 0-1000: ops until 600, then the thread waits 600-900 while a gloo all-reduce runs
    # elsewhere (400-900); a 50 us gap (300-350) inside it is Python overhead, not a wait.
    tl = StepTimeline(span=(0, 1000), phases=[("backward", 0, 1000)],
                      host_ops=[(0, 300), (350, 600), (900, 1000)], comm=[(400, 900)],
                      host_comm=[])
    out = attribute(tl, min_wait_us=100)
    _check_partition(out, tl.span)
    assert out["communication"] == 300      # 600-900: blocked while the collective is in flight
    assert out["backward"] == 700           # includes the 50 us gap and the overlapped 400-600
    # a call to a collective on the training thread is communication whatever range it is in
    tl.host_comm = [(950, 1000)]
    out = attribute(tl, min_wait_us=100)
    assert out["communication"] == 350 and out["backward"] == 650


def test_gpu_device_work_goes_to_the_phase_that_launched_it():
    # the host launches forward work quickly then waits at the end (sync); the device is busy with
    # lm_forward kernels 100-700 and backward kernels 700-900; an NCCL kernel runs 850-980 and is
    # exposed for 900-980 (no compute kernel then).
    tl = StepTimeline(span=(0, 1000),
                      phases=[("data_wait", 0, 50), ("lm_forward", 60, 200), ("backward", 200, 300),
                              ("optimizer", 300, 320)],
                      host_ops=[(60, 200), (200, 300), (300, 320), (320, 1000)],
                      comm=[(850, 980)],
                      device=[("lm_forward", 100, 700), ("backward", 700, 900)])
    out = attribute(tl)
    _check_partition(out, tl.span)
    assert out["data_wait"] == 50
    assert out["lm_forward"] == 40 + 600    # host range 60-100 before the device starts, then kernels
    assert out["backward"] == 200
    assert out["communication"] == 80       # 900-980
    assert out["other"] == 10 + 20          # 50-60 between ranges and 980-1000 after the kernels
    assert out["optimizer"] == 0            # its host range is covered by earlier device work


def test_data_wait_wins_over_device_work_and_empty_span():
    tl = StepTimeline(span=(0, 100), phases=[("data_wait", 0, 100)], device=[("backward", 0, 100)])
    assert attribute(tl)["data_wait"] == 100
    assert sum(attribute(StepTimeline(span=(5, 5))).values()) == 0


def test_breakdown_shares_and_table():
    secs = dict.fromkeys(PHASES, 0.0)
    secs.update(lm_forward=0.3, backward=0.5, optimizer=0.1, communication=0.05, other=0.05)
    b = Breakdown(rank=0, steps=[4, 5], phase_seconds=secs, profiled_seconds=1.0, measured_seconds=1.0,
                  comm_in_flight_seconds=0.2, trace="t.json")
    assert math.isclose(sum(b.shares().values()), 1.0)
    text = format_breakdown(b)
    assert "steps 5-6" in text and "t.json" in text
    assert "backward" in text and "250.0" in text           # 0.5 s over 2 steps
    assert "150.0 ms of it hidden" not in text and "75.0 ms of it hidden" in text
    assert b.to_dict()["shares"]["backward"] == pytest.approx(0.5)


def test_extraction_from_a_real_profile():
    """Ranges recorded under torch.profiler come back as the timeline the attribution reads."""
    lin = torch.nn.Linear(64, 64)
    x = torch.randn(256, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for step in (7, 8):
            with record_function(f"vlmdata.step#{step}"):
                with record_function("vlmdata.lm_forward"):
                    y = lin(x).relu().sum()
                with record_function("vlmdata.backward"):
                    y.backward()
                with record_function("vlmdata.optimizer"):
                    with torch.no_grad():
                        lin.weight -= 0.01 * lin.weight.grad
    events = profiler_events(prof)
    assert events and all(e.end >= e.start for e in events)
    timelines = timelines_from_events(events)
    assert sorted(timelines) == [7, 8]
    tl = timelines[8]
    assert sorted(name for name, _, _ in tl.phases) == ["backward", "lm_forward", "optimizer"]
    assert tl.host_ops and not tl.device and not tl.comm
    b = breakdown_from_events(events, {7: 0.5, 8: 0.5, 9: 1.0})
    assert b.steps == [7, 8] and b.measured_seconds == 1.0
    assert math.isclose(b.total_seconds, b.profiled_seconds, rel_tol=1e-9)
    assert b.phase_seconds["lm_forward"] > 0 and b.phase_seconds["backward"] > 0
    assert breakdown_from_events(events, {1: 0.1}) is None  # no measured step in the profile

    class OnlyFunctionEvents:  # a profiler object without Kineto's raw results: the FunctionEvent path
        def events(self):
            return prof.events()

    slow = profiler_events(OnlyFunctionEvents())
    assert {(e.name, e.thread) for e in slow if e.name.startswith("vlmdata.")} == \
        {(e.name, e.thread) for e in events if e.name.startswith("vlmdata.")}
    b_slow = breakdown_from_events(slow, {7: 0.5, 8: 0.5})
    assert b_slow.steps == [7, 8]
    for p in ("lm_forward", "backward", "optimizer"):
        assert b_slow.phase_seconds[p] == pytest.approx(b.phase_seconds[p], rel=0.02, abs=1e-5)
