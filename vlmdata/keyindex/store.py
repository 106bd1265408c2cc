"""keys.lmdb: a dataset's sample key -> (shard, row) index, bulk-loaded in key order, read lock-free.

One LMDB file (no sub-directory) with two named databases:

    keys   key bytes -> 8-byte (shard, row) locations (codec); sorted duplicates, for
           datasets indexed in place whose shards repeat a key
    meta   b"meta" -> JSON: format version, entries, distinct keys, the manifest's shard
           signature (to notice an index left over from another version of the dataset)

Writing (`write_key_index`) appends sorted blocks (MDB_APPEND: pages are
filled left to right, nothing is compared or split), committing every
`COMMIT_KEYS` pairs so that a write transaction's dirty pages stay small.
Reading (`KeyIndex`) opens the file read-only without LMDB's lock file, so
any number of processes can read it concurrently and a dataset on a
read-only mount works; readers never block each other or anything else.

Address space: a reader maps the file's size, checked against its header
first (`lmdb_file`: a truncated or foreign file is a `BadKeyIndexError`,
never a SIGBUS). A writer starts with a small map and doubles it when LMDB
says it is full (the uncommitted pairs are written again), up to what the
process's RLIMIT_AS (`ulimit -v`) leaves, so sharding works under the
8-16 GiB limits clusters set.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable

import lmdb
import numpy as np

from vlmdata.errors import BadKeyIndexError
from vlmdata.keyindex.codec import decode_location, encode_key
from vlmdata.keyindex.lmdb_file import check_lmdb_file, map_size_for
from vlmdata.sysinfo import address_space_left

__all__ = ["KEYS_NAME", "KeyIndex", "KeyIndexStats", "write_key_index"]

KEYS_NAME = "keys.lmdb"
FORMAT_VERSION = 1
MAX_MAP = (1 << 40) if sys.maxsize > 2 ** 32 else (1 << 30)    # address space, not disk: the file grows as written
INITIAL_MAP = 64 << 20                                           # a writer's first map; doubled when full
COMMIT_KEYS = 1 << 20
EXAMPLES = 5


class KeyIndexStats(dict):
    """What a build wrote: entries, distinct keys, duplicates (entries - distinct) and a few duplicate keys."""


_READERS: dict[str, tuple[int, lmdb.Environment]] = {}   # path -> (pid, env): one env per file and process


def _reader_env(path: str) -> lmdb.Environment:
    """The process's read-only environment of `path`. LMDB allows one per file and process; one inherited
    through fork belongs to the parent and is closed here (in the child) before opening our own."""
    st = os.stat(path)
    key = f"{os.path.realpath(path)}:{st.st_dev}:{st.st_ino}"     # a rebuilt file is a new environment
    got = _READERS.get(key)
    if got is not None and got[0] == os.getpid():
        return got[1]
    if got is not None:
        got[1].close()
    env = lmdb.open(path, subdir=False, readonly=True, lock=False, max_dbs=2, readahead=False,
                    map_size=map_size_for(check_lmdb_file(path)))
    _READERS[key] = (os.getpid(), env)
    return env


def _map_cap() -> int:
    """The largest map a writer may grow to: 3/4 of the address space left under RLIMIT_AS, else MAX_MAP."""
    left = address_space_left()
    return MAX_MAP if left is None else min(MAX_MAP, left * 3 // 4)


class _GrowingWriter:
    """Write transactions on an environment whose map doubles when full: every put since the last commit is
    kept (as a function of the transaction) and applied again after the map grew."""

    def __init__(self, path: str):
        cap = _map_cap()
        self.map_size = min(INITIAL_MAP, cap)
        self.env = lmdb.open(path, subdir=False, map_size=self.map_size, max_dbs=2, lock=False, sync=False,
                             metasync=False, readahead=False)
        self.keys_db = self.env.open_db(b"keys", dupsort=True, dupfixed=True)
        self.meta_db = self.env.open_db(b"meta")
        self.txn = self.env.begin(write=True)
        self.pending: list = []

    def apply(self, fn) -> None:
        """Run `fn(txn)` in the current transaction (again after a growth if the map fills)."""
        self.pending.append(fn)
        try:
            fn(self.txn)
        except lmdb.MapFullError:
            self._grow_and_replay()

    def _grow_and_replay(self) -> None:
        while True:
            self.txn.abort()
            cap = _map_cap()
            if self.map_size >= cap:
                raise BadKeyIndexError(f"keys.lmdb needs more than {self.map_size >> 20} MiB of address space, "
                                       f"more than this process may map (ulimit -v leaves {cap >> 20} MiB usable)")
            self.map_size = min(self.map_size * 2, cap)
            self.env.set_mapsize(self.map_size)
            self.txn = self.env.begin(write=True)
            try:
                for fn in self.pending:
                    fn(self.txn)
                return
            except lmdb.MapFullError:
                continue

    def commit(self) -> None:
        self.txn.commit()
        self.pending = []
        self.txn = self.env.begin(write=True)

    def close(self, commit: bool) -> None:
        if commit:
            self.txn.commit()
            self.env.sync(True)
        else:
            self.txn.abort()
        self.env.close()


def _put_slice(txn: lmdb.Transaction, db, keys: np.ndarray, vals: np.ndarray, same: np.ndarray) -> None:
    klist, vlist = keys.tolist(), vals.tolist()
    cur = txn.cursor(db=db)
    consumed, added = cur.putmulti(zip(klist, vlist), dupdata=True, append=True)
    if added != len(klist):
        # copies of a key out of location order (pairs not added in location order): insert those in place
        for i in np.flatnonzero(same).tolist():
            cur.put(klist[i], vlist[i], dupdata=True)


def write_key_index(path: str, blocks: Iterable[tuple[np.ndarray, np.ndarray]], meta: dict) -> KeyIndexStats:
    """Write a new key index at local `path` from (keys, values) blocks in key order; returns its stats.

    `meta` is stored with the counts added. The file is flushed to disk before returning.
    """
    for p in (path, path + "-lock"):
        if os.path.exists(p):
            os.unlink(p)
    w = _GrowingWriter(path)
    entries = distinct = 0
    examples: list[str] = []
    last = None
    ok = False
    try:
        since_commit = 0
        for keys, vals in _slices(blocks):
            same = np.zeros(len(keys), bool)
            same[1:] = keys[1:] == keys[:-1]
            same[0] = keys[0] == last
            n_dup = int(same.sum())
            if n_dup and len(examples) < EXAMPLES:
                for k in (keys[i] for i in np.flatnonzero(same)[:EXAMPLES].tolist()):
                    if k.decode("utf-8", "replace") not in examples and len(examples) < EXAMPLES:
                        examples.append(k.decode("utf-8", "replace"))
            w.apply(lambda txn, k=keys, v=vals, s=same: _put_slice(txn, w.keys_db, k, v, s))
            entries += len(keys)
            distinct += len(keys) - n_dup
            last = keys[-1]
            since_commit += len(keys)
            if since_commit >= COMMIT_KEYS:
                w.commit()
                since_commit = 0
        stored = keys_db_entries(w.txn, w.keys_db)
        if stored != entries:
            raise RuntimeError(f"key index holds {stored} entries after writing {entries}")
        stats = KeyIndexStats(entries=entries, distinct=distinct, duplicates=entries - distinct,
                              duplicate_examples=examples)
        record = json.dumps({**meta, **stats, "version": FORMAT_VERSION}, sort_keys=True).encode()
        w.apply(lambda txn: txn.put(b"meta", record, db=w.meta_db))
        ok = True
    finally:
        w.close(commit=ok)
    return stats


def _slices(blocks: Iterable[tuple[np.ndarray, np.ndarray]], size: int = 1 << 16):
    """The blocks cut to at most `size` pairs (each slice becomes Python objects for LMDB all at once)."""
    for keys, vals in blocks:
        for i in range(0, len(keys), size):
            yield keys[i:i + size], vals[i:i + size]


def keys_db_entries(txn: lmdb.Transaction, db) -> int:
    return int(txn.stat(db)["entries"])


class KeyIndex:
    """A key index opened read-only and lock-free; picklable (reopened in each process that uses it)."""

    def __init__(self, path: str):
        self.path = path
        if not os.path.isfile(path):
            raise FileNotFoundError(path)
        self._env = None
        self._pid = -1
        self.meta = self._load_meta()

    def _open(self):
        if self._env is None or self._pid != os.getpid():
            try:
                env = _reader_env(self.path)
                self._keys = env.open_db(b"keys", create=False, dupsort=True, dupfixed=True)
                self._meta_db = env.open_db(b"meta", create=False)
            except lmdb.NotFoundError:
                raise BadKeyIndexError(f"{self.path} is not a vlmdata key index") from None
            except lmdb.Error as exc:
                raise BadKeyIndexError(f"{self.path} cannot be opened as a key index: {exc}") from None
            self._env, self._pid = env, os.getpid()
        return self._env

    def _load_meta(self) -> dict:
        env = self._open()
        with env.begin(db=self._meta_db) as txn:
            raw = txn.get(b"meta")
        if raw is None:
            raise ValueError(f"{self.path} has no metadata: it was not written completely; rebuild it "
                             "(`vlmdata index --rebuild-keys DATASET`)")
        meta = json.loads(raw)
        if meta.get("version", 0) > FORMAT_VERSION:
            raise ValueError(f"{self.path} has key index version {meta['version']}; upgrade vlmdata")
        return meta

    def __len__(self) -> int:
        return int(self.meta["entries"])

    def locations(self, key: str | bytes) -> list[tuple[int, int]]:
        """Every (shard, row) holding `key` (one, unless the dataset repeats the key); [] if none."""
        env = self._open()
        with env.begin(db=self._keys) as txn:
            cur = txn.cursor()
            if not cur.set_key(encode_key(key)):
                return []
            return [decode_location(v) for v in cur.iternext_dup(keys=False, values=True)]

    def __contains__(self, key: str | bytes) -> bool:
        env = self._open()
        with env.begin(db=self._keys) as txn:
            return txn.get(encode_key(key)) is not None

    def contains_encoded(self, keys: list[bytes]) -> list[bool]:
        """Membership of already-encoded keys, in one read transaction."""
        env = self._open()
        with env.begin(db=self._keys) as txn:
            get = txn.get
            return [get(k) is not None for k in keys]

    def close(self) -> None:
        """Close the process's environment of this file (every KeyIndex of the file in this process shares it)."""
        if self._env is not None:
            for key, (pid, env) in list(_READERS.items()):
                if env is self._env and pid == os.getpid():
                    del _READERS[key]
                    env.close()
        self._env = None

    def __getstate__(self) -> dict:
        return {"path": self.path, "meta": self.meta, "_env": None, "_pid": -1}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
