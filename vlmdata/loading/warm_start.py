"""Planning the first window in the training process, in the background, while the user's code goes on.

A VLMDataset is usually built before the model is (seconds to minutes of loading weights) and
iterated after. `warm(plan)` runs `plan` (the first window of the epoch, written into the dataset's
plan share) in a daemon thread of the process that built the dataset, so the DataLoader workers
find the window planned instead of reading the planning columns and packing it themselves before
their first pack.

No process is forked while such a thread runs: an `os.register_at_fork` hook joins every running
one first (a forked child would inherit whatever locks the thread held). Spawned workers start
fresh; they wait on the share's window lock, which the planning thread holds, and then map the
window. A failure is logged and forgotten: whoever needs the window plans it again and sees the
error itself.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

__all__ = ["join_warm", "warm"]

log = logging.getLogger(__name__)

_running: set[threading.Thread] = set()
_guard = threading.Lock()


def _run(plan: Callable[[], object]) -> None:
    try:
        plan()
    except Exception as exc:      # noqa: BLE001 - the workers plan the window again and raise there
        log.debug("warm-start planning failed (the loader plans the window itself): %s", exc)
    finally:
        with _guard:
            _running.discard(threading.current_thread())


def warm(plan: Callable[[], object]) -> threading.Thread:
    """Run `plan` in a background daemon thread; returns the thread."""
    thread = threading.Thread(target=_run, args=(plan,), name="vlmdata-warm-plan", daemon=True)
    with _guard:
        _running.add(thread)
    thread.start()
    return thread


def join_warm() -> None:
    """Wait for every warm-start thread of this process."""
    with _guard:
        threads = [t for t in _running if t is not threading.current_thread()]
    for t in threads:
        t.join()


os.register_at_fork(before=join_warm)
