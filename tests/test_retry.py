"""The one retry policy of remote reads: transient errors are retried up to a deadline, corrupt data a few
times, permanent errors never; a simulated clock, so no test sleeps."""
from __future__ import annotations

import pytest

from vlmdata.errors import CorruptShardError, FetchError
from vlmdata.retry import DEFAULT_DEADLINE, RetryPolicy, error_kind


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


def failing_until(clock: FakeClock, until: float, exc: Exception, result="ok"):
    calls = []

    def fn():
        calls.append(clock.now)
        if clock.now < until:
            raise exc
        return result

    return fn, calls


def test_an_outage_shorter_than_the_deadline_costs_time_not_the_read():
    clock = FakeClock()
    fn, calls = failing_until(clock, 100.0, ConnectionRefusedError("store down"))
    policy = RetryPolicy(deadline=300.0, base_delay=0.5, max_delay=10.0, seed=1)
    assert policy.call(fn, "s3://b/x", sleep=clock.sleep, clock=clock) == "ok"
    assert clock.now >= 100.0 and len(calls) > 10            # many more than the old 4 attempts
    assert max(clock.sleeps) <= 10.0                          # backoff is capped


def test_a_failure_past_the_deadline_is_a_fetch_error_naming_the_object():
    clock = FakeClock()
    fn, calls = failing_until(clock, float("inf"), TimeoutError("read timed out"))
    policy = RetryPolicy(deadline=120.0, base_delay=1.0, max_delay=20.0, seed=2)
    with pytest.raises(FetchError, match=r"s3://b/x: failed after \d+ attempts in 12\d\.\ds: TimeoutError") as exc:
        policy.call(fn, "s3://b/x", sleep=clock.sleep, clock=clock)
    assert isinstance(exc.value.__cause__, TimeoutError)
    assert 120.0 <= clock.now <= 120.0 + 1e-9                 # the last attempt is made at the deadline, not later


def test_default_deadline_is_minutes():
    assert RetryPolicy().deadline == DEFAULT_DEADLINE >= 120


@pytest.mark.parametrize("exc", [FileNotFoundError("gone"), PermissionError("denied"), IsADirectoryError("dir"),
                                 ValueError("bad url"), KeyError("bug"), FetchError("not a regular file")])
def test_permanent_errors_are_raised_at_once(exc):
    clock = FakeClock()
    fn, calls = failing_until(clock, float("inf"), exc)
    with pytest.raises(type(exc)):
        RetryPolicy().call(fn, "x", sleep=clock.sleep, clock=clock)
    assert len(calls) == 1 and clock.sleeps == []


def test_corrupt_data_gets_a_few_attempts_not_the_deadline():
    clock = FakeClock()
    fn, calls = failing_until(clock, float("inf"), CorruptShardError("crc mismatch"))
    with pytest.raises(CorruptShardError, match="after 3 attempts"):
        RetryPolicy(corrupt_attempts=3).call(fn, "x", sleep=clock.sleep, clock=clock)
    assert len(calls) == 3


def test_attempts_caps_every_kind():
    clock = FakeClock()
    fn, calls = failing_until(clock, float("inf"), ConnectionResetError("reset"))
    with pytest.raises(FetchError):
        RetryPolicy(attempts=2, deadline=1e9).call(fn, "x", sleep=clock.sleep, clock=clock)
    assert len(calls) == 2


def test_network_library_errors_are_transient_and_credentials_are_not():
    from aiohttp import ClientConnectionError
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError, ReadTimeoutError

    assert error_kind(EndpointConnectionError(endpoint_url="http://x")) == "transient"   # not an OSError
    assert error_kind(ReadTimeoutError(endpoint_url="http://x")) == "transient"
    assert error_kind(ClientConnectionError("reset")) == "transient"
    assert error_kind(NoCredentialsError()) == "permanent"
    assert error_kind(ConnectionRefusedError()) == "transient"
    assert error_kind(CorruptShardError("x")) == "corrupt"
    assert error_kind(RuntimeError("bug")) == "permanent"


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(deadline=-1)
