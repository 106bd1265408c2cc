"""One plan per rank (or node): planned windows shared by processes through memory-mapped files.

Every DataLoader worker of a rank walks the same global pack sequence (it
takes every nw-th of the rank's steps), so every worker needs every window.
Planning them in each worker multiplies the planning CPU by the number of
workers. Instead the windows live in a `PlanShare`, a directory (on
/dev/shm when it exists: memory, not disk) created by the process that
builds the dataset, before its workers start, and handed to them by path
(fork or spawn alike). Inside, one `SharedWindows` per (plan, epoch):

    counts        int64[num_windows, 2]: a window's pack count (-1 until planned) and its check (CRC32 of
                  plan key, window and count); a count whose check does not match is unknown
    locks         one byte-range lock per window (fcntl.lockf: per process, released if it dies)
    w0000042.plan window 42: header (plan key with the dataset fingerprint, window, BLAKE2b of the
                  arrays), then samples, bounds, tokens, images [, image tokens, their squares]
                  (int64), memory-mapped
    journal       one line per window planned: "window pid cpu_seconds" (who planned what; tests, benchmarks)

Everything in a share is private to its user (`vlmdata.fsutil`): the folders are 0700 and
checked to be ours and writable by us only, files are opened without following symlinks and
checked the same way, so another local user cannot plant a window, a journal link or a counts
file in a `plan_dir` under /dev/shm (`UnsafePathError` says why). A window whose header or checksum
does not match (torn, foreign, forged) is never used: it is planned again and replaced. A count
whose check does not match (e.g. a counts file of zeros) is treated as unknown: the window is planned.

A process asking for window k maps its file if it exists; otherwise it takes
window k's lock, looks again (another process may have just written it),
and plans it, writes it under a temporary name, renames it into place and
records its count. So each window is planned once per share, whatever the
number of workers; the others wait for it or map it. Windows far behind the
newest (more than `keep`, 16 by default: tens of MB) are deleted, so the
share holds a few windows, not the epoch; a process that still needs a
deleted one plans it again. The workers of a rank stay within a few packs of
each other (the DataLoader takes their packs in turn and each runs at most
`prefetch_factor` ahead) and ranks within a step (collectives), while a
window holds thousands of packs, so that is rare; it costs CPU, never
correctness: the plan is a pure function, so every copy is the same (the
header names the plan and window, and a test checks equality across
processes).

`PlanShare.create()` makes a private share (one rank: removed when the
process that made it exits; leftovers of killed processes are removed by
the next one). `PlanShare.at(directory)` names a share several ranks agree
on (one node: all local ranks then plan each window once); there, stores of
epochs older than the previous one are removed when a new epoch starts.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import mmap
import os
import re
import shutil
import tempfile
import time
import weakref
import zlib
from collections import Counter, OrderedDict
from collections.abc import Callable

import numpy as np

from vlmdata.fsutil import open_private, private_dir
from vlmdata.plan.window_store import WindowPlan
from vlmdata.sysinfo import pid_alive

__all__ = ["PlanShare", "SharedWindows"]

log = logging.getLogger(__name__)

MAGIC = b"VLMPLAN2"
_PRIVATE = re.compile(r"^vlmdata-plan-(\d+)-")
_EPOCH = re.compile(r"^(.*)-e(\d+)$")
_SAFE_KEY = re.compile(r"^[A-Za-z0-9_.-]+$")


def _default_parent() -> str:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


def _ours(path: str) -> bool:
    """A real folder (not a symlink) of this user: what a private share's leftovers look like."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return os.path.isdir(path) and not os.path.islink(path) and st.st_uid == os.geteuid()


def _remove_if_owner(root: str, pid: int) -> None:
    if os.getpid() == pid:                  # never from a forked or spawned copy
        shutil.rmtree(root, ignore_errors=True)


class PlanShare:
    """A directory where the planners of one rank (or node) share planned windows; picklable (a path)."""

    def __init__(self, root: str, private: bool = False):
        self.root = root
        self.private = private

    @classmethod
    def create(cls, parent: str | None = None) -> PlanShare:
        """A new private share under `parent` (default /dev/shm, else the temp dir), removed when this
        process exits or `close()` is called; shares of processes that no longer exist are removed first."""
        parent = parent or _default_parent()
        for name in os.listdir(parent) if os.path.isdir(parent) else ():
            m = _PRIVATE.match(name)
            if m and not pid_alive(int(m.group(1))) and _ours(os.path.join(parent, name)):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        root = private_dir(tempfile.mkdtemp(prefix=f"vlmdata-plan-{os.getpid()}-", dir=parent))
        share = cls(root, private=True)
        share._finalizer = weakref.finalize(share, _remove_if_owner, root, os.getpid())
        return share

    @classmethod
    def at(cls, directory: str) -> PlanShare:
        """A share in `directory` that several processes (e.g. all ranks of a node) agree on; created 0700, or
        refused (`UnsafePathError`) when it is a symlink or another user owns or can write it."""
        return cls(private_dir(directory))

    def store(self, key: str, num_windows: int, keep: int = 16) -> SharedWindows:
        """The windows of plan `key` (e.g. '<fingerprint>-e<epoch>')."""
        if not _SAFE_KEY.match(key):
            raise ValueError(f"plan key {key!r} must be letters, digits, '_', '.' or '-'")
        if not self.private:
            self._drop_old_epochs(key)
        return SharedWindows(os.path.join(self.root, key), key, num_windows, keep)

    def _drop_old_epochs(self, key: str) -> None:
        m = _EPOCH.match(key)
        if m is None:
            return
        plan, epoch = m.group(1), int(m.group(2))
        for name in os.listdir(self.root):
            old = _EPOCH.match(name)
            if old and old.group(1) == plan and int(old.group(2)) < epoch - 1:
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

    def close(self) -> None:
        """Remove a private share now (from the process that created it)."""
        fin = getattr(self, "_finalizer", None)
        if fin is not None:
            fin()

    def __getstate__(self) -> dict:
        return {"root": self.root, "private": self.private}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


class BadWindow(ValueError):
    """A window file that must not be used (torn, foreign or forged); it is planned again."""


def _digest(arrays: list[bytes]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        h.update(a)
    return h.hexdigest()


def _encode(key: str, k: int, plan: WindowPlan) -> list[bytes]:
    vision = plan.image_tokens is not None
    fields = [plan.samples, plan.bounds, plan.tokens, plan.images]
    fields += [plan.image_tokens, plan.image_squares] if vision else []
    arrays = [np.ascontiguousarray(a, dtype="<i8").tobytes() for a in fields]
    head = json.dumps({"key": key, "window": k, "packs": plan.num_packs, "samples": len(plan.samples),
                       "dropped": dict(plan.dropped), "vision": vision, "blake2b": _digest(arrays)},
                      sort_keys=True).encode()
    pad = (-(len(MAGIC) + 4 + len(head))) % 8
    return [MAGIC, len(head).to_bytes(4, "little"), head, b" " * pad] + arrays


def _decode(buf: mmap.mmap, key: str, k: int, path: str) -> WindowPlan:
    """The window in `buf`; BadWindow unless its header names window k of plan `key` and its arrays match
    the header's size and checksum."""
    if buf[:len(MAGIC)] != MAGIC:
        raise BadWindow(f"{path} is not a planned window of this vlmdata version")
    n_head = int.from_bytes(buf[len(MAGIC):len(MAGIC) + 4], "little")
    pos = len(MAGIC) + 4
    try:
        head = json.loads(bytes(buf[pos:pos + n_head]))
        n, p = int(head["samples"]), int(head["packs"])
        dropped = Counter({str(r): int(c) for r, c in head["dropped"].items()})
        want_key, want_k, digest = head["key"], head["window"], head["blake2b"]
        vision = bool(head.get("vision"))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise BadWindow(f"{path} has an unreadable header") from None
    if want_key != key or want_k != k:
        raise BadWindow(f"{path} holds window {want_k} of plan {want_key}, not window {k} of {key}")
    pos += n_head + (-(pos + n_head)) % 8
    if n < 0 or p < 0 or len(buf) != pos + 8 * ((5 if vision else 3) * n + p + 1):
        raise BadWindow(f"{path} is {len(buf)} bytes, not what its header describes")
    out = []
    for count in (n, p + 1, n, n) + ((n, n) if vision else ()):
        out.append(np.frombuffer(buf, dtype="<i8", count=count, offset=pos))
        pos += 8 * count
    if _digest([memoryview(a) for a in out]) != digest:
        raise BadWindow(f"{path} does not match its checksum (torn, or written by something else)")
    return WindowPlan(out[0], out[1], out[2], out[3], dropped, *(out[4:6] if vision else (None, None)))


def _count_check(key: str, k: int, count: int) -> int:
    return zlib.crc32(f"{key}/{k}/{count}".encode())


class SharedWindows:
    """The planned windows of one (plan, epoch) in a share directory (a WindowStore; see the module docstring).

    Counters for this process: `computed` (windows it planned), `mapped`
    (windows it took from the share), `plan_seconds` (CPU seconds it spent planning).
    """

    def __init__(self, directory: str, key: str, num_windows: int, keep: int = 16, cache: int = 4):
        self.directory = directory
        self.key = key
        self.num_windows = int(num_windows)
        self.keep = max(2, int(keep))
        self.directory = private_dir(directory)
        self._counts = self._open_counts()
        self._mapped: OrderedDict[int, WindowPlan] = OrderedDict()
        self._cache = max(1, int(cache))
        self._lock_fd = -1
        self._lock_pid = -1
        self._evicted_below = 0
        self.computed = 0
        self.mapped = 0
        self.plan_seconds = 0.0
        self._warned = False

    def _open_counts(self) -> np.ndarray:
        """The shared (count, check) pairs, memory-mapped read-write."""
        path = os.path.join(self.directory, "counts")
        rows = max(1, self.num_windows)
        if not os.path.lexists(path):
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-counts-")
            with os.fdopen(fd, "wb") as f:
                f.write(np.full((rows, 2), -1, "<i8").tobytes())
            try:
                os.link(tmp, path)          # never replaces counts another process already published
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
        fd = open_private(self.directory, "counts", os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size != 16 * rows:
                raise ValueError(f"{path} counts {size // 16} windows, this plan has {self.num_windows}: "
                                 "two different plans share one key")
            buf = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return np.frombuffer(buf, dtype="<i8").reshape(rows, 2)

    def _path(self, k: int) -> str:
        return os.path.join(self.directory, f"w{k:07d}.plan")

    def count(self, k: int) -> int | None:
        c, check = (int(v) for v in self._counts[k])
        return c if c >= 0 and check == _count_check(self.key, k, c) else None

    def _set_count(self, k: int, count: int) -> None:
        self._counts[k, 0] = -1                 # a reader in between sees "unknown", never a wrong count
        self._counts[k, 1] = _count_check(self.key, k, count)
        self._counts[k, 0] = count

    def _map(self, k: int) -> WindowPlan | None:
        """Window k from its file; None when there is none or it must not be used (then it is planned again)."""
        name = os.path.basename(self._path(k))
        try:
            fd = open_private(self.directory, name, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            if os.fstat(fd).st_size == 0:
                return None
            buf = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        try:
            return _decode(buf, self.key, k, self._path(k))
        except BadWindow as exc:
            log.warning("not using a shared window: %s; planning it again", exc)
            return None

    def _locked(self, k: int, fn: Callable[[], WindowPlan]) -> WindowPlan:
        if self._lock_pid != os.getpid():
            self._lock_fd = open_private(self.directory, "locks", os.O_RDWR | os.O_CREAT)
            self._lock_pid = os.getpid()
        fcntl.lockf(self._lock_fd, fcntl.LOCK_EX, 1, k)
        try:
            return fn()
        finally:
            fcntl.lockf(self._lock_fd, fcntl.LOCK_UN, 1, k)

    def get(self, k: int, compute: Callable[[], WindowPlan]) -> WindowPlan:
        plan = self._mapped.get(k)
        if plan is not None:
            self._mapped.move_to_end(k)
            return plan
        plan = self._map(k)
        if plan is None:
            plan = self._locked(k, lambda: self._map(k) or self._plan(k, compute))
        else:
            self.mapped += 1
        self._mapped[k] = plan
        while len(self._mapped) > self._cache:
            self._mapped.popitem(last=False)
        return plan

    def _plan(self, k: int, compute: Callable[[], WindowPlan]) -> WindowPlan:
        t0 = time.process_time()
        plan = compute()
        self.plan_seconds += time.process_time() - t0
        self.computed += 1
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-w")
            with os.fdopen(fd, "wb") as f:
                for part in _encode(self.key, k, plan):
                    f.write(part)
            os.replace(tmp, self._path(k))
        except OSError as exc:                  # e.g. a full /dev/shm: plan on, unshared
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
            if not self._warned:
                log.warning("cannot share planned windows in %s (%s): other processes will plan them again",
                            self.directory, exc)
                self._warned = True
            return plan
        except BaseException:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
            raise
        self._set_count(k, plan.num_packs)
        line = f"{k} {os.getpid()} {time.process_time() - t0:.6f}\n".encode()
        fd = open_private(self.directory, "journal", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line)                  # one small O_APPEND write: lines never interleave
        finally:
            os.close(fd)
        self._evict(k)
        return plan

    def journal(self) -> list[tuple[int, int, float]]:
        """(window, pid, CPU seconds) of every window planned into this store, in order."""
        try:
            with os.fdopen(open_private(self.directory, "journal", os.O_RDONLY)) as f:
                return [(int(a), int(b), float(c)) for a, b, c in (line.split() for line in f)]
        except FileNotFoundError:
            return []

    def _evict(self, newest: int) -> None:
        """Delete the files of windows more than `keep` behind the newest planned one."""
        for j in range(self._evicted_below, newest - self.keep):
            try:
                os.unlink(self._path(j))
            except FileNotFoundError:
                pass
        self._evicted_below = max(self._evicted_below, newest - self.keep)
