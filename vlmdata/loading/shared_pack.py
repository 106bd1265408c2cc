"""A pack's tensors written once, into a reusable shared-memory buffer that the main process maps.

Why. Torch's DataLoader hands a worker's tensors to the main process by moving
each one into a new shared-memory segment (a full copy), sending one file
descriptor per tensor and mapping each in the main process. The copy lands in
fresh pages, and fresh pages cost a page fault and a zeroing each: on the
2-core VM these benchmarks run on, 7.5 us per 4 KiB page, so moving a 336 px
image (83 pages) cost 0.6 ms, more than a memmap shard's whole read path and a
third of a JPEG's decode (tools/profile_loader.py, BENCHMARKS.md issue 16).

How. Collate asks a `PackWriter` for the arrays it fills (`add` declares a
field's dtype and shape, `allocate` returns numpy arrays to write into,
`finish` returns the `PackedBatch`). In a DataLoader worker the arrays are
views of one buffer from the worker's pool: a memfd with a 64-byte header
whose first byte says whether the main process still uses it. The pack is
pickled by `ForkingPickler` (the DataLoader's queue) as that one descriptor
plus the fields' offsets, dtypes and shapes; the main process maps the buffer
and builds the same tensors as views of it (no copy), and when the last of them
is gone a finalizer writes "free" into the header. The worker then reuses the
buffer: its pages are already in place, nothing is faulted or zeroed again.
A pool holds up to `POOL_BUFFERS` buffers per worker; when all are in use
(a consumer keeping many packs), packs get one-off buffers, still sent without
a copy. Outside a worker (0 workers), without memfd (not Linux), or when a
pack is pickled any other way (pickle, torch.save, copy), a PackedBatch is an
ordinary dict of ordinary tensors.

Fixed-size pixels are allocated (n, S, S, 3) and handed out as the
[n, 3, S, S] view (`torch.channels_last` memory format): decoders and memmap
shards hold HWC pixels, so each image is one plain copy into the pack, with no
transpose. `pixel_values.contiguous()` gives the NCHW layout where a consumer
needs it; torch operators (conv, `.to(device)`, `.float()`) take it as is.
"""
from __future__ import annotations

import logging
import math
import mmap
import os
import threading
import uuid
import weakref
from multiprocessing.reduction import DupFd, ForkingPickler

import numpy as np
import torch
from torch.utils.data import get_worker_info

from vlmdata.sysinfo import pid_alive

__all__ = ["POOL_BUFFERS", "PackWriter", "PackedBatch", "set_shared_packs", "shared_memory_available"]

log = logging.getLogger(__name__)

HEADER = 64               # bytes before the first field; byte 0 is the buffer's state
ALIGN = 64
FREE, BUSY = 0, 1
POOL_BUFFERS = 8          # reusable buffers per worker process
GROW = 1 << 20            # buffer capacities are rounded up to this
_FREE_BYTE = bytes([FREE])


def shared_memory_available() -> bool:
    """True where packs can live in reusable shared memory (Linux memfd)."""
    return hasattr(os, "memfd_create")


class _Buffer:
    """One memfd mapped read-write in this process; `array` is its bytes as uint8."""

    def __init__(self, key: str, capacity: int, pooled: bool):
        self.fd = os.memfd_create("vlmdata-pack", getattr(os, "MFD_CLOEXEC", 0))
        try:
            os.ftruncate(self.fd, capacity)
            self.mm = mmap.mmap(self.fd, capacity)
        except BaseException:
            os.close(self.fd)
            raise
        self.array = np.frombuffer(self.mm, np.uint8)
        self.key = key
        self.capacity = capacity
        self.pooled = pooled
        self.announced = False          # its descriptor went to the DataLoader's main process already
        self.pid = os.getpid()

    def is_free(self) -> bool:
        return int(self.array[0]) == FREE

    def set_state(self, state: int) -> None:
        self.array[0] = state

    def close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Pool:
    """This process's reusable buffers."""

    def __init__(self):
        self.pid = os.getpid()
        self.token = f"{self.pid}-{uuid.uuid4().hex[:12]}"
        self.buffers: list[_Buffer] = []
        self.retired: list[str] = []    # announced buffers closed since the last pack was sent
        self.serial = 0
        self.one_offs = 0

    def _new(self, capacity: int, pooled: bool) -> _Buffer:
        self.serial += 1
        return _Buffer(f"{self.token}-{self.serial}", capacity, pooled)

    def acquire(self, nbytes: int) -> _Buffer:
        """A buffer of at least `nbytes` marked busy: a free pooled one if any fits, else a new one."""
        free = [b for b in self.buffers if b.is_free()]
        fits = [b for b in free if b.capacity >= nbytes]
        if fits:
            buf = min(fits, key=lambda b: b.capacity)
        else:
            capacity = -(-(nbytes + nbytes // 4) // GROW) * GROW      # headroom for bigger packs
            if len(self.buffers) >= POOL_BUFFERS and free:           # replace a free one that is too small
                small = min(free, key=lambda b: b.capacity)
                self.buffers.remove(small)
                if small.announced:
                    self.retired.append(small.key)
                small.close_fd()
            if len(self.buffers) < POOL_BUFFERS:
                buf = self._new(capacity, pooled=True)
                self.buffers.append(buf)
            else:
                self.one_offs += 1
                if self.one_offs == 1:
                    log.debug("all %d pack buffers of pid %d are held by the consumer; using one-off buffers",
                              POOL_BUFFERS, self.pid)
                buf = self._new(-(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE, pooled=False)
        buf.set_state(BUSY)
        return buf

    def take_retired(self) -> list[str]:
        out, self.retired = self.retired, []
        return out


_POOL: _Pool | None = None


def _pool() -> _Pool:
    global _POOL
    if _POOL is None or _POOL.pid != os.getpid():     # a forked child starts its own pool
        _POOL = _Pool()
    return _POOL


class _Lease:
    """A pack's hold on its buffer in the worker: freed here if the pack is never sent."""

    def __init__(self, buffer: _Buffer):
        self.buffer = buffer
        self.sent = False

    def __del__(self) -> None:
        buf = self.buffer
        if buf.pid != os.getpid():
            return
        if not self.sent and buf.pooled and buf.fd >= 0:
            buf.set_state(FREE)
        if not buf.pooled:
            buf.close_fd()


class PackedBatch(dict):
    """The dict a VLMDataset yields (see docs/architecture.md, PackedBatch).

    An ordinary dict of tensors and plain values; in a DataLoader worker its tensors live in a
    shared-memory buffer and cross to the main process without a copy (see the module docstring).
    """

    def __copy__(self) -> PackedBatch:
        out = PackedBatch(self)
        out.__dict__.update(self.__dict__)           # a copy shares the lease: sent once at most
        return out

    def __reduce_ex__(self, protocol):
        return (PackedBatch, (dict(self),))           # plain pickling: ordinary tensors, no buffer


def _tensor_field(base: np.ndarray, spec: tuple) -> torch.Tensor:
    _, offset, dtype, shape, permute = spec
    dt = np.dtype(dtype)
    count = math.prod(shape)
    arr = base[offset:offset + count * dt.itemsize].view(dt).reshape(shape)
    t = torch.from_numpy(arr)
    return t.permute(*permute) if permute else t


def _bytes_field(base: np.ndarray, spec: tuple) -> list[np.ndarray]:
    _, offset, sizes = spec
    out, pos = [], offset
    for n in sizes:
        out.append(base[pos:pos + n])
        pos += n
    return out


# ---- the receiving (main) process --------------------------------------------------------------
# Descriptors of the pooled buffers of the DataLoader workers this process receives packs from,
# sent once per buffer: key -> (fd, worker pid). Entries go when the worker retires the buffer
# or exits; each received pack maps its buffer anew and holds its own duplicate of the fd.
_KNOWN: dict[str, tuple[int, int]] = {}
_KNOWN_LOCK = threading.Lock()


def _forget(keys) -> None:
    for key in keys:
        got = _KNOWN.pop(key, None)
        if got is not None:
            os.close(got[0])


def _register(key: str, fd: int) -> None:
    pid = int(key.split("-", 1)[0])
    with _KNOWN_LOCK:
        if all(p != pid for _, p in _KNOWN.values()):        # a new worker: forget those that exited
            _forget([k for k, (_, p) in _KNOWN.items() if not pid_alive(p)])
        _forget([key])
        _KNOWN[key] = (fd, pid)


def _release(fd: int, pid: int) -> None:
    """The pack's last tensor is gone: tell the worker it may reuse the buffer, close our fd."""
    if os.getpid() != pid:           # a forked child dropping its copy must not free the parent's buffer
        return
    try:
        os.pwrite(fd, _FREE_BYTE, 0)
    except OSError:
        pass
    finally:
        os.close(fd)


def _rebuild(key: str, df, keep: bool, capacity: int, retired: list, fields: dict, rest: dict) -> PackedBatch:
    """Map the worker's buffer and rebuild the pack's tensors as views of it (no copy)."""
    if retired:
        with _KNOWN_LOCK:
            _forget(retired)
    if df is not None:
        fd = df.detach()
        if keep:
            _register(key, fd)
            fd = os.dup(fd)
    else:
        with _KNOWN_LOCK:
            known = _KNOWN.get(key)
            if known is None:
                raise RuntimeError(f"pack buffer {key} is unknown here: its packs must all reach one process "
                                   "(set_shared_packs(False) for pipelines that fan packs out)")
            fd = os.dup(known[0])
    try:
        mm = mmap.mmap(fd, capacity)
    except BaseException:
        os.close(fd)
        raise
    base = np.frombuffer(mm, np.uint8)
    weakref.finalize(base, _release, fd, os.getpid())
    out = PackedBatch(rest)
    for name, spec in fields.items():
        out[name] = _tensor_field(base, spec) if spec[0] == "tensor" else _bytes_field(base, spec)
    return out


def _reduce(batch: PackedBatch):
    lease: _Lease | None = batch.__dict__.get("_lease")
    buf = lease.buffer if lease is not None else None
    if buf is None or lease.sent or buf.pid != os.getpid() or buf.fd < 0:
        return (PackedBatch, (dict(batch),))
    specs, views = batch.__dict__["_specs"], batch.__dict__["_views"]
    fields, rest = {}, {}
    for name, value in batch.items():
        if name in specs and value is views[name]:
            fields[name] = specs[name]
        else:
            rest[name] = value                         # replaced after collate: pickled the usual way
    lease.sent = True
    # a DataLoader worker's packs all reach its main process: a pooled buffer's fd goes there once
    keep = buf.pooled and _in_worker()
    df = None if keep and buf.announced else DupFd(buf.fd)
    buf.announced = buf.announced or keep
    retired = _pool().take_retired() if keep else []
    return (_rebuild, (buf.key, df, keep, buf.capacity, retired, fields, rest))


ForkingPickler.register(PackedBatch, _reduce)


_FORCED: bool | None = None


def set_shared_packs(enabled: bool | None) -> None:
    """Where packs go to shared memory: None (default) = inside DataLoader workers only; True = in
    every process, as in a DataLoader worker (a pipeline of your own that sends each process's packs
    with ForkingPickler to one receiving process, in order; a benchmark of the worker's path);
    False = never (torch's DataLoader then copies them)."""
    global _FORCED
    _FORCED = enabled


def _in_worker() -> bool:
    if _FORCED is not None:
        return _FORCED
    return get_worker_info() is not None


class PackWriter:
    """Lays out one pack's arrays in one buffer; see the module docstring.

    `shared`: None = shared memory inside a DataLoader worker (where memfd exists), else private.
    """

    def __init__(self, shared: bool | None = None):
        if shared is None:
            shared = _in_worker()
        self.shared = bool(shared) and shared_memory_available()
        self._specs: dict[str, tuple] = {}
        self._size = HEADER
        self._arrays: dict | None = None
        self._lease: _Lease | None = None

    def _place(self, nbytes: int) -> int:
        offset = -(-self._size // ALIGN) * ALIGN
        self._size = offset + nbytes
        return offset

    def add(self, name: str, dtype, shape: tuple[int, ...], permute: tuple[int, ...] | None = None) -> None:
        """Declare an array field; the pack's tensor is `from_numpy(array).permute(*permute)`."""
        dt = np.dtype(dtype)
        shape = tuple(int(x) for x in shape)
        offset = self._place(math.prod(shape) * dt.itemsize)
        self._specs[name] = ("tensor", offset, dt.str, shape, tuple(permute) if permute else None)

    def add_bytes(self, name: str, sizes: list[int]) -> None:
        """Declare a list of byte strings, stored back to back; the pack holds uint8 array views."""
        sizes = [int(n) for n in sizes]
        self._specs[name] = ("bytes", self._place(sum(sizes)), sizes)

    @property
    def nbytes(self) -> int:
        return self._size

    def allocate(self) -> dict:
        """The arrays to fill: numpy arrays in the declared shapes, lists of uint8 arrays for bytes."""
        if self.shared:
            buf = _pool().acquire(self._size)
            self._lease = _Lease(buf)
            base = buf.array
        else:
            base = np.empty(self._size, np.uint8)
        self._arrays = {}
        for name, spec in self._specs.items():
            if spec[0] == "tensor":
                _, offset, dtype, shape, _ = spec
                dt = np.dtype(dtype)
                count = math.prod(shape)
                self._arrays[name] = base[offset:offset + count * dt.itemsize].view(dt).reshape(shape)
            else:
                self._arrays[name] = _bytes_field(base, spec)
        return self._arrays

    def finish(self, plain: dict | None = None) -> PackedBatch:
        """The PackedBatch: the declared fields as tensors (views of the arrays), then `plain` items."""
        if self._arrays is None:
            self.allocate()
        out = PackedBatch()
        views = {}
        for name, spec in self._specs.items():
            arr = self._arrays[name]
            if spec[0] == "tensor":
                t = torch.from_numpy(arr)
                views[name] = out[name] = t.permute(*spec[4]) if spec[4] else t
            else:
                views[name] = out[name] = arr
        if plain:
            out.update(plain)
        if self._lease is not None:
            out.__dict__.update(_lease=self._lease, _specs=dict(self._specs), _views=views)
        return out
