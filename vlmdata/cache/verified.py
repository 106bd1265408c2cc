"""Which local files have had their CRC32 checked, shared by a process and the workers it forks.

A shard's CRC32 is checked once when it enters a cache (its bytes are checked while they are
written) or, for a file found on disk (a local dataset, an SSD-tier entry left by an earlier
run), on its first open in this process tree; later opens check only its size. Checking at
every open cost a full pass over the shard's bytes per DataLoader worker per epoch (a third
of a memmap shard's read path).

A file is known by its identity: path, device, inode, size, modification and status-change
times, and the CRC32 it was checked against. Rewriting or replacing the file changes the
identity, so the new bytes are checked again. The set lives in an anonymous shared mapping
made when this module is first imported (in the training process, before DataLoader workers
fork), so every worker of every epoch shares it; with the "spawn" start method each process has
its own. It is a fixed-size open-addressing table of 64-bit hashes: when it is full, old entries
are overwritten and those files are simply checked again.
"""
from __future__ import annotations

import hashlib
import mmap
import os
import struct

import numpy as np

__all__ = ["VERIFIED", "VerifiedFiles", "file_identity"]

SLOTS = 1 << 16          # 512 KiB of shared memory; pages are touched only as entries are added
PROBES = 16


def file_identity(path: str, st: os.stat_result, crc32: int | None) -> int:
    """A nonzero 64-bit hash of the file's identity and the CRC32 it was checked against."""
    text = (f"{os.path.realpath(path)}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|"
            f"{st.st_ctime_ns}|{crc32}")
    (h,) = struct.unpack("<Q", hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=8).digest())
    return h or 1


class VerifiedFiles:
    """A set of file identities (see `file_identity`) in shared memory; safe to use after fork."""

    def __init__(self, slots: int = SLOTS):
        self.slots = int(slots)
        self._mm = mmap.mmap(-1, self.slots * 8)      # MAP_SHARED | MAP_ANONYMOUS: inherited by fork
        self._table = np.frombuffer(self._mm, dtype=np.uint64)

    def __contains__(self, ident: int) -> bool:
        table, start = self._table, ident % self.slots
        for k in range(PROBES):
            v = int(table[(start + k) % self.slots])
            if v == ident:
                return True
            if v == 0:
                return False
        return False

    def add(self, ident: int) -> None:
        table, start = self._table, ident % self.slots
        for k in range(PROBES):
            j = (start + k) % self.slots
            v = int(table[j])
            if v == ident:
                return
            if v == 0:
                table[j] = ident
                return
        table[start] = ident          # full around here: the entry it replaces is checked again later

    def clear(self) -> None:
        self._table[:] = 0

    def __reduce__(self):
        return (VerifiedFiles, (self.slots,))      # another process (spawn) starts with an empty set


VERIFIED = VerifiedFiles()
