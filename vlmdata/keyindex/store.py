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
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable

import lmdb
import numpy as np

from vlmdata.keyindex.codec import decode_location, encode_key

__all__ = ["KEYS_NAME", "KeyIndex", "KeyIndexStats", "write_key_index"]

KEYS_NAME = "keys.lmdb"
FORMAT_VERSION = 1
MAP_SIZE = (1 << 40) if sys.maxsize > 2 ** 32 else (1 << 30)   # address space, not disk: the file grows as written
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
    env = lmdb.open(path, subdir=False, readonly=True, lock=False, max_dbs=2, readahead=False, map_size=MAP_SIZE)
    _READERS[key] = (os.getpid(), env)
    return env


def _open_env(path: str, readonly: bool) -> lmdb.Environment:
    if readonly:
        return _reader_env(path)
    return lmdb.open(path, subdir=False, map_size=MAP_SIZE, max_dbs=2, lock=False, sync=False,
                     metasync=False, readahead=False)


def write_key_index(path: str, blocks: Iterable[tuple[np.ndarray, np.ndarray]], meta: dict) -> KeyIndexStats:
    """Write a new key index at local `path` from (keys, values) blocks in key order; returns its stats.

    `meta` is stored with the counts added. The file is flushed to disk before returning.
    """
    for p in (path, path + "-lock"):
        if os.path.exists(p):
            os.unlink(p)
    env = _open_env(path, readonly=False)
    entries = distinct = 0
    examples: list[str] = []
    last = None
    try:
        keys_db = env.open_db(b"keys", dupsort=True, dupfixed=True)
        meta_db = env.open_db(b"meta")
        txn = env.begin(write=True, db=keys_db)
        since_commit = 0
        for keys, vals in _slices(blocks):
            klist = keys.tolist()
            vlist = vals.tolist()
            same = np.zeros(len(keys), bool)
            same[1:] = keys[1:] == keys[:-1]
            same[0] = klist[0] == last
            n_dup = int(same.sum())
            if n_dup and len(examples) < EXAMPLES:
                for k in (klist[i] for i in np.flatnonzero(same)[:EXAMPLES].tolist()):
                    if k.decode("utf-8", "replace") not in examples and len(examples) < EXAMPLES:
                        examples.append(k.decode("utf-8", "replace"))
            cur = txn.cursor()
            consumed, added = cur.putmulti(zip(klist, vlist), dupdata=True, append=True)
            if added != len(klist):
                # a key's copies straddled two merged blocks out of location order: insert those in place
                for i in np.flatnonzero(same).tolist():
                    cur.put(klist[i], vlist[i], dupdata=True)
            entries += len(klist)
            distinct += len(klist) - n_dup
            last = klist[-1]
            since_commit += len(klist)
            if since_commit >= COMMIT_KEYS:
                txn.commit()
                txn = env.begin(write=True, db=keys_db)
                since_commit = 0
        stored = keys_db_entries(txn, keys_db)
        if stored != entries:
            raise RuntimeError(f"key index holds {stored} entries after writing {entries}")
        stats = KeyIndexStats(entries=entries, distinct=distinct, duplicates=entries - distinct,
                              duplicate_examples=examples)
        txn.put(b"meta", json.dumps({**meta, **stats, "version": FORMAT_VERSION}, sort_keys=True).encode(),
                db=meta_db)
        txn.commit()
        env.sync(True)
    finally:
        env.close()
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
            env = _open_env(self.path, readonly=True)
            try:
                self._keys = env.open_db(b"keys", create=False, dupsort=True, dupfixed=True)
                self._meta_db = env.open_db(b"meta", create=False)
            except lmdb.NotFoundError:
                raise ValueError(f"{self.path} is not a vlmdata key index") from None
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
