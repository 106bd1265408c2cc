"""Where tuning results are kept: one JSON file keyed by (machine, dataset, pipeline settings).

The file (default `~/.cache/vlmdata/tune.json`, or `$VLMDATA_CACHE_DIR/tune.json`)
is rewritten atomically (temporary file + rename) under an advisory lock
(`tune.json.lock`), so several ranks of one node can share it: the first
tunes while the others wait on the lock, then read its result.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import torch

from vlmdata import fsutil
from vlmdata.sysinfo import cpu_model
from vlmdata.tune.results import TuneResult

log = logging.getLogger(__name__)

CACHE_VERSION = 1
CACHE_FILE = "tune.json"


def default_cache_path() -> str:
    """`$VLMDATA_CACHE_DIR/tune.json`, else `~/.cache/vlmdata/tune.json`."""
    root = os.environ.get("VLMDATA_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "vlmdata")
    return os.path.join(root, CACHE_FILE)


def local_world_size() -> int:
    """Ranks sharing this machine (LOCAL_WORLD_SIZE, as torchrun sets it; else 1)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def usable_cpus() -> int:
    """CPUs this process may run on, shared among the local ranks."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return max(1, n // local_world_size())


def total_memory() -> int:
    """Physical memory in bytes (MemTotal)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("MemTotal not found in /proc/meminfo")


def machine_fingerprint(cpu_count: int) -> dict:
    """What makes a tuning result valid only on this kind of machine."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu_model": cpu_model(), "cpus": cpu_count, "memory_gib": round(total_memory() / 2**30),
            "gpu": gpu, "torch": torch.__version__.split("+")[0]}


def plain_data(value, depth: int = 0):
    """A JSON-able description of a configuration value (None if it has none)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth > 3:
        return None
    if isinstance(value, (list, tuple)):
        return [plain_data(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): plain_data(v, depth + 1) for k, v in value.items()}
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return plain_data(to_dict(), depth + 1)
    if hasattr(value, "__dataclass_fields__"):
        return {k: plain_data(getattr(value, k), depth + 1) for k in value.__dataclass_fields__}
    return type(value).__qualname__


@runtime_checkable
class Fingerprinted(Protocol):
    """A dataset that describes itself for the tuning cache (VLMDataset does)."""

    def tune_fingerprint(self) -> dict:
        """Plain data that identifies the data and the pipeline settings (no credentials)."""
        ...


def dataset_fingerprint(dataset) -> dict:
    """What identifies the data and the pipeline settings.

    A `Fingerprinted` dataset describes itself. Anything else is described by
    its public top-level plain attributes (dicts are left out: they may hold
    credentials, and the "about" record is stored in clear).
    """
    if isinstance(dataset, Fingerprinted):
        fp = dict(dataset.tune_fingerprint())
    else:
        fp = {k: plain_data(v) for k, v in sorted(vars(dataset).items())
              if not k.startswith("_") and not isinstance(v, dict)}
    fp["class"] = f"{type(dataset).__module__}.{type(dataset).__qualname__}"
    return fp


def cache_key(machine: dict, dataset: dict, extra: dict) -> str:
    """Stable hash of the three fingerprints."""
    blob = json.dumps({"machine": machine, "dataset": dataset, "extra": extra}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class TuneCache:
    """The JSON file of tuning results."""

    def __init__(self, path: str | None = None):
        self.path = path or default_cache_path()

    @contextlib.contextmanager
    def locked(self) -> Iterator[TuneCache]:
        """Hold the advisory lock (blocks while another process tunes)."""
        folder = fsutil.private_dir(os.path.dirname(os.path.abspath(self.path)))   # results pick worker counts
        fd = fsutil.open_private(folder, os.path.basename(self.path) + ".lock", os.O_RDWR | os.O_CREAT)
        with os.fdopen(fd, "r+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield self
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def _load(self) -> dict:
        path = os.path.abspath(self.path)
        try:
            with os.fdopen(fsutil.open_private(os.path.dirname(path), os.path.basename(path), os.O_RDONLY)) as f:
                data = json.load(f)
        except FileNotFoundError:
            return {"version": CACHE_VERSION, "entries": {}}
        except json.JSONDecodeError as exc:
            log.warning("tune cache %s is not valid JSON (%s): starting a new one", self.path, exc)
            return {"version": CACHE_VERSION, "entries": {}}
        if data.get("version") != CACHE_VERSION or not isinstance(data.get("entries"), dict):
            log.warning("tune cache %s has another format version: starting a new one", self.path)
            return {"version": CACHE_VERSION, "entries": {}}
        return data

    def get(self, key: str) -> TuneResult | None:
        entry = self._load()["entries"].get(key)
        if entry is None:
            return None
        try:
            return TuneResult.from_dict(entry["result"], from_cache=True)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("tune cache entry %s is unreadable (%s): re-tuning", key, exc)
            return None

    def put(self, key: str, result: TuneResult, about: dict) -> None:
        """Store `result` under `key` (with the fingerprints in `about`), atomically."""
        data = self._load()
        data["entries"][key] = {"about": about, "result": result.to_dict()}
        fsutil.atomic_write_bytes(self.path, json.dumps(data, indent=1, sort_keys=True).encode())

    def keys(self) -> list[str]:
        return list(self._load()["entries"])
