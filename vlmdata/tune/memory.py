"""Memory of processes from /proc: worker discovery and peak RSS/PSS sampling (Linux)."""
from __future__ import annotations

import glob
import os
import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProcMem:
    """One reading of /proc/<pid>/smaps_rollup, bytes."""

    rss: int
    pss: int
    uss: int          # Private_Clean + Private_Dirty: freed if the process exits


def read_proc_mem(pid: int) -> ProcMem | None:
    """Memory of `pid`, or None if it has exited (or /proc is unavailable)."""
    values: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                    values[parts[0][:-1]] = int(parts[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    if "Rss" not in values:
        return None
    return ProcMem(rss=values["Rss"], pss=values.get("Pss", values["Rss"]),
                   uss=values.get("Private_Clean", 0) + values.get("Private_Dirty", 0))


def child_pids(pid: int | None = None) -> set[int]:
    """Direct children of `pid` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    out: set[int] = set()
    files = glob.glob(f"/proc/{pid}/task/*/children")
    if files:
        for path in files:
            try:
                with open(path) as f:
                    out.update(int(x) for x in f.read().split())
            except FileNotFoundError:
                continue
        return out
    for stat in glob.glob("/proc/[0-9]*/stat"):          # kernels without the children file
        try:
            with open(stat) as f:
                text = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = text.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.add(int(stat.split("/")[2]))
    return out


@dataclass
class MemoryPeaks:
    """Peak memory seen per worker process and for the consumer."""

    workers: dict[int, ProcMem] = field(default_factory=dict)
    main_pss: int = 0


class MemorySampler:
    """Samples the memory of new child processes (the loader's workers) on a thread.

    Children that existed when the sampler was created are ignored, so only
    the workers of the loader being measured are counted.
    """

    def __init__(self, interval_s: float = 0.1):
        self.interval_s = interval_s
        self.ignore = child_pids()
        self.peaks = MemoryPeaks()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vlmdata-tune-mem", daemon=True)

    def start(self) -> MemorySampler:
        self.sample()
        self._thread.start()
        return self

    def sample(self) -> None:
        for pid in child_pids() - self.ignore:
            mem = read_proc_mem(pid)
            if mem is None:
                continue
            old = self.peaks.workers.get(pid)
            if old is None or mem.pss > old.pss:
                self.peaks.workers[pid] = mem
        main = read_proc_mem(os.getpid())
        if main is not None:
            self.peaks.main_pss = max(self.peaks.main_pss, main.pss)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> MemoryPeaks:
        """Take a last sample, stop the thread and return the peaks."""
        self.sample()
        self._stop.set()
        self._thread.join()
        return self.peaks
