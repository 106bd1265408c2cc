"""Facts about the machine that benchmarks, caches keyed by machine, and the demo report; worker processes
that die with their parent."""
from __future__ import annotations

import os
import platform
import signal
import sys
import threading

__all__ = ["address_space_left", "cpu_model", "die_with_parent", "pid_alive"]

PR_SET_PDEATHSIG = 1          # linux/prctl.h
_WATCH_SECONDS = 1.0


def die_with_parent() -> None:
    """Make this (worker) process end when its parent does, even by `kill -9`; a pool initializer.

    A pool's workers wait on a pipe whose write end they hold themselves (fork), so a parent killed
    without cleaning up leaves them waiting forever. Linux: PR_SET_PDEATHSIG (SIGKILL) via prctl;
    elsewhere a daemon thread that exits the process once its parent is gone. Either way, a parent
    already gone by the time this runs ends the process at once.
    """
    parent = os.getppid()
    armed = False
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent:       # the parent died before the signal was armed
        os._exit(1)
    if not armed:
        def watch() -> None:
            while not threading.Event().wait(_WATCH_SECONDS):
                if os.getppid() != parent:
                    os._exit(1)

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def address_space_left() -> int | None:
    """Bytes of address space this process may still map under its RLIMIT_AS (`ulimit -v`); None if unlimited."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        used = 0
    return max(0, soft - used)
