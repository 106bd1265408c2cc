"""Facts about the machine that benchmarks, caches keyed by machine, and the demo report."""
from __future__ import annotations

import os
import platform

__all__ = ["address_space_left", "cpu_model", "pid_alive"]


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
