"""keys.lmdb: bulk-loaded in key order (duplicates kept, also when added out of location order), read-only and
lock-free by many processes at once, metadata checked, pickled readers reopen."""
import multiprocessing
import os
import pickle

import numpy as np
import pytest

from vlmdata.keyindex import KeyIndex, KeySorter, encode_locations, write_key_index


def build(path, keys, shard_of_row=100, run_keys=10**6, block=1 << 18):
    vals = encode_locations(np.arange(len(keys)) // shard_of_row, np.arange(len(keys)) % shard_of_row)
    with KeySorter(run_keys=run_keys) as sorter:
        sorter.add(np.asarray(keys, dtype="S"), vals)
        return write_key_index(str(path), sorter.sorted_blocks(block), {"what": "test"})


def test_every_key_and_every_duplicate_is_found(tmp_path):
    keys = [f"k{i:05d}".encode() for i in range(3000)]
    keys[2500] = keys[10]                                # a duplicate in a later "shard"
    keys[2999] = keys[10]
    stats = build(tmp_path / "k.lmdb", keys, run_keys=700, block=64)
    assert stats["entries"] == 3000 and stats["duplicates"] == 2 and stats["duplicate_examples"] == ["k00010"]
    ix = KeyIndex(str(tmp_path / "k.lmdb"))
    assert len(ix) == 3000 and ix.meta["what"] == "test" and ix.meta["distinct"] == 2998
    assert ix.locations("k00010") == [(0, 10), (25, 0), (29, 99)]
    assert ix.locations("k01234") == [(12, 34)] and "k01234" in ix and "nope" not in ix
    assert ix.locations("nope") == [] and ix.contains_encoded([b"k00001", b"x"]) == [True, False]
    assert not os.path.exists(str(tmp_path / "k.lmdb") + "-lock")        # no lock file, written or read


def test_duplicates_added_out_of_location_order_are_kept(tmp_path):
    # blocks in key order whose copies of "dup" are not in location order (a caller that added pairs out of
    # shard order): the loader must still store all of them, in location order
    loc = encode_locations
    blocks = [(np.asarray([b"a", b"dup"], dtype="S"), np.concatenate([loc(0, [0]), loc(3, [0])])),
              (np.asarray([b"dup", b"dup", b"z"], dtype="S"), np.concatenate([loc(1, [0]), loc(2, [5]), loc(0, [1])]))]
    stats = write_key_index(str(tmp_path / "k.lmdb"), blocks, {})
    ix = KeyIndex(str(tmp_path / "k.lmdb"))
    assert ix.locations("dup") == [(1, 0), (2, 5), (3, 0)] and ix.locations("z") == [(0, 1)]
    assert stats["entries"] == len(ix) == 5 and stats["duplicates"] == 2


def read_many(path, keys, out):
    ix = pickle.loads(path)
    out.put(sum(len(ix.locations(k)) for k in keys))


def test_many_processes_read_at_once_without_a_lock(tmp_path):
    keys = [f"k{i:05d}".encode() for i in range(2000)]
    build(tmp_path / "k.lmdb", keys)
    os.chmod(str(tmp_path / "k.lmdb"), 0o444)                 # a read-only dataset
    ix = KeyIndex(str(tmp_path / "k.lmdb"))
    ix.locations("k00001")
    blob = pickle.dumps(ix)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=read_many, args=(blob, keys[i::4], out)) for i in range(4)]
    for p in procs:
        p.start()
    assert sorted(out.get(timeout=60) for _ in procs) == [500] * 4
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert not os.path.exists(str(tmp_path / "k.lmdb") + "-lock")


def test_unfinished_or_foreign_files_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError):
        KeyIndex(str(tmp_path / "missing.lmdb"))
    import lmdb

    env = lmdb.open(str(tmp_path / "half.lmdb"), subdir=False, max_dbs=2, lock=False)
    env.open_db(b"keys", dupsort=True, dupfixed=True)
    env.open_db(b"meta")
    env.close()
    with pytest.raises(ValueError, match="not written completely"):
        KeyIndex(str(tmp_path / "half.lmdb"))
