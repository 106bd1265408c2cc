"""The one retry policy of every remote read: exponential backoff with full jitter, up to a deadline.

Every read the loader makes of the object store goes through `RetryPolicy.call`: the manifest and
planning columns when a dataset opens, each shard's index, each shard (directly, through the
in-process cache or the node daemon). A transient outage then costs time, never samples: the read
waits it out. Only a failure that lasts past the deadline is raised (a `FetchError` naming the object,
the attempts and the time spent), and the loader skips and counts what it could not read.

What is retried, and for how long:

- transient errors — connection refused or reset, timeouts, throttling, server errors: every
  `OSError` that is not one of the permanent kinds below, and any exception raised by a network
  client library (botocore, aiohttp, urllib3, requests, http.client, ...), which often do not
  derive from OSError — until `deadline` seconds after the first attempt (default 5 minutes, long
  enough for a typical store outage or a restarting endpoint);
- corrupt data (`CorruptShardError`: bytes arrived but failed the size or CRC check, e.g. a torn
  transfer): `corrupt_attempts` attempts, because a corrupt object stays corrupt;
- permanent errors — not found, permission denied, not a regular file, missing credentials, a
  malformed request or any other exception (a bug, a bad URL) — are raised at once, unchanged.

`attempts` optionally caps the attempts of every kind (for callers that prefer failing fast).
"""
from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from vlmdata.errors import CorruptShardError, FetchError

__all__ = ["DEFAULT_DEADLINE", "RetryPolicy", "error_kind"]

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_DEADLINE = 300.0      # seconds: a typical object-store outage or endpoint restart
_NETWORK_LIBRARIES = frozenset({"botocore", "aiobotocore", "aiohttp", "urllib3", "requests", "http", "ssl",
                                "s3fs", "gcsfs", "adlfs", "google", "azure", "fsspec"})
_PERMANENT_NAMES = ("Credential", "ParamValidation", "NoSuchBucket", "AccessDenied", "InvalidAccessKey",
                    "SignatureDoesNotMatch", "UnknownServiceError", "InvalidRegion")
_PERMANENT_OS_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
_LOG_EVERY = 30.0             # seconds between warnings while one read keeps failing


def error_kind(exc: BaseException) -> str:
    """"transient", "corrupt" or "permanent": how the policy treats a failed attempt (module docstring)."""
    if isinstance(exc, CorruptShardError):
        return "corrupt"
    if isinstance(exc, (FetchError, *_PERMANENT_OS_ERRORS)) or not isinstance(exc, Exception):
        return "permanent"
    mro = type(exc).__mro__
    if any(p in c.__name__ for c in mro for p in _PERMANENT_NAMES):
        return "permanent"
    if isinstance(exc, OSError) or any(c.__module__.split(".")[0] in _NETWORK_LIBRARIES for c in mro):
        return "transient"
    return "permanent"


@dataclass
class RetryPolicy:
    """Exponential backoff with full jitter, bounded by a deadline (see the module docstring).

    deadline: seconds after the first attempt during which transient errors are retried.
    attempts: an optional cap on attempts of any kind (None: as many as the deadline allows).
    corrupt_attempts: attempts when the bytes arrive but fail their size/CRC check.
    base_delay / max_delay: the n-th retry waits uniform(0, min(max_delay, base_delay * 2**n)) seconds.
    seed: seeds the jitter (tests).
    """

    attempts: int | None = None
    base_delay: float = 0.2
    max_delay: float = 10.0
    seed: int | None = None
    deadline: float = DEFAULT_DEADLINE
    corrupt_attempts: int = 3
    _rng: random.Random = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be >= 1 or None, got {self.attempts}")
        if self.deadline < 0 or self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("RetryPolicy.deadline, base_delay and max_delay must be >= 0")
        if self.corrupt_attempts < 1:
            raise ValueError(f"RetryPolicy.corrupt_attempts must be >= 1, got {self.corrupt_attempts}")
        self._rng = random.Random(self.seed)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` + 1 (full jitter)."""
        return self._rng.uniform(0, min(self.max_delay, self.base_delay * (2 ** min(attempt, 30))))

    def call(self, fn: Callable[[], T], what: str, sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> T:
        """`fn()`, retried as the policy says; `what` names the object in logs and errors.

        Raises the permanent error unchanged, or, once retries are spent, a FetchError
        (CorruptShardError for corrupt data) chained to the last error.
        """
        start = clock()
        attempt = corrupt = 0
        warned = None
        while True:
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - classified below; network errors come in many types
                kind = error_kind(exc)
                if kind == "permanent":
                    raise
                attempt += 1
                corrupt += kind == "corrupt"
                elapsed = clock() - start
                spent = (self.attempts is not None and attempt >= self.attempts) or \
                    (kind == "corrupt" and corrupt >= self.corrupt_attempts) or \
                    (kind == "transient" and elapsed >= self.deadline)
                if spent:
                    error = CorruptShardError if kind == "corrupt" else FetchError
                    raise error(f"{what}: failed after {attempt} attempts in {elapsed:.1f}s: "
                                f"{type(exc).__name__}: {exc}") from exc
                wait = self.delay(attempt - 1)
                if kind == "transient":
                    wait = min(wait, max(0.0, self.deadline - elapsed))
                if warned is None or clock() - warned >= _LOG_EVERY:
                    warned = clock()
                    log.warning("reading %s failed (%s: %s); retrying for up to %.0fs more", what,
                                type(exc).__name__, exc, max(0.0, self.deadline - elapsed))
                else:
                    log.debug("reading %s failed again (%s); retry %d in %.2fs", what, exc, attempt, wait)
                sleep(wait)
