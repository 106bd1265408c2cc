"""Duplicate keys at shard time in bounded memory: within the run, and against datasets that exist.

`RunDedup` replaces an in-memory set of key hashes (8+ bytes per key in the
sharding process, many GB at 10^9 rows, and a 64-bit hash collision drops a
sample by chance) with an LMDB file of the run's keys: exact, on disk, its
pages cached by the OS as memory allows. Each key maps to the number of the
row (in the run's input stream) that first had it, so marking is a pure
function of the stream: rows are marked a batch (a job) at a time in one
write transaction, and a run resumed after a crash, which streams its rows
again, finds its earlier rows under their own numbers (not duplicates) and
reaches the same decisions without starting the file over.

Keys already in other datasets (`--dedup-against`) are looked up in their
keys.lmdb, opened read-only; a row whose key is there is skipped under
`Skip.DUPLICATE_IN_DATASET` (it never enters the run's file).
"""
from __future__ import annotations

import json
import os
import shutil

import lmdb

from vlmdata.keyindex.codec import encode_key
from vlmdata.keyindex.store import MAP_SIZE, KeyIndex

__all__ = ["IN_RUN", "RunDedup"]

IN_RUN = ""          # `mark` result: an earlier row of this run had the key


class RunDedup:
    """First occurrence wins (see the module docstring). `against`: (dataset name, its KeyIndex) pairs."""

    def __init__(self, path: str, run_id: str, against: list[tuple[str, KeyIndex]] | None = None):
        self.path = path
        self.run_id = run_id
        self.against = list(against or [])
        self._env: lmdb.Environment | None = None
        try:
            self._env = self._open()
        except (lmdb.Error, ValueError):
            self.remove()                # from another run, or damaged by a machine crash: start over
            self._env = self._open()

    def _open(self) -> lmdb.Environment:
        env = lmdb.open(self.path, subdir=False, map_size=MAP_SIZE, max_dbs=2, sync=False, metasync=False,
                        readahead=False)
        try:
            self._keys = env.open_db(b"keys")
            meta_db = env.open_db(b"meta")
            with env.begin(write=True, db=meta_db) as txn:
                raw = txn.get(b"run")
                if raw is None:
                    txn.put(b"run", json.dumps({"run": self.run_id}).encode())
                elif json.loads(raw).get("run") != self.run_id:
                    raise ValueError(f"{self.path} holds another run's keys")
        except BaseException:
            env.close()
            raise
        return env

    def mark(self, keys: list[str], rows: list[int]) -> list[str | None]:
        """Per key: None (first occurrence; recorded), IN_RUN (an earlier row had it), or the name of
        a dataset in `against` that holds it. `rows` are the rows' numbers in the run's input stream."""
        enc = [encode_key(k) for k in keys]
        out: list[str | None] = [None] * len(enc)
        for name, index in self.against:
            for i, hit in enumerate(index.contains_encoded(enc)):
                if hit and out[i] is None:
                    out[i] = name
        with self._env.begin(write=True, db=self._keys) as txn:
            for i, (k, row) in enumerate(zip(enc, rows)):
                if out[i] is not None:
                    continue
                value = int(row).to_bytes(8, "big")
                if not txn.put(k, value, overwrite=False) and txn.get(k) != value:
                    out[i] = IN_RUN
        return out

    def __len__(self) -> int:
        with self._env.begin(db=self._keys) as txn:
            return int(txn.stat(self._keys)["entries"])

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    def remove(self) -> None:
        """Close and delete the run's key file."""
        self.close()
        for p in (self.path, self.path + "-lock"):
            if os.path.isdir(p):
                shutil.rmtree(p, ignore_errors=True)
            elif os.path.exists(p):
                os.unlink(p)
