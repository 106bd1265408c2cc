"""SeenKeys and RunDedup: first occurrence wins, exactly like a set in memory, through flushes to runs and
merges of runs; keys of other datasets are named; the same stream gives the same decisions again."""
import numpy as np
import pytest

from vlmdata.keyindex import (
    IN_RUN,
    KeyIndex,
    KeySorter,
    RunDedup,
    SeenKeys,
    encode_locations,
    write_key_index,
)


def stream(n, seed, repeat=0.2, batch=37):
    """Batches of (keys, rows): random keys, `repeat` of them repeating an earlier one (or one in the batch)."""
    rng = np.random.default_rng(seed)
    keys = []
    for _ in range(n):
        if keys and rng.random() < repeat:
            keys.append(keys[int(rng.integers(len(keys)))])
        else:
            keys.append(f"k{int(rng.integers(0, 2**62)):x}")
    return [(keys[i:i + batch], list(range(i, min(n, i + batch)))) for i in range(0, n, batch)]


@pytest.mark.parametrize("memtable,fanout", [(10**6, 8), (50, 3), (7, 2)])
def test_first_rows_equal_a_set_in_memory_through_flushes_and_merges(tmp_path, memtable, fanout):
    seen = SeenKeys(str(tmp_path / "s"), memtable=memtable, fanout=fanout)
    first: dict[str, int] = {}
    for keys, rows in stream(3000, seed=memtable):
        expected = [first.setdefault(k, r) for k, r in zip(keys, rows)]
        assert seen.first_rows(keys, rows) == expected
    assert len(seen) == len(first)
    if memtable < 100:
        assert 0 < seen.runs < len(first) // memtable          # flushed, and runs were merged
    seen.remove()
    assert not (tmp_path / "s").exists()


def other_dataset(path, keys):
    with KeySorter() as sorter:
        sorter.add(np.asarray([k.encode() for k in keys], dtype="S"), encode_locations(0, np.arange(len(keys))))
        write_key_index(str(path), sorter.sorted_blocks(), {})
    return KeyIndex(str(path))


def test_run_dedup_names_other_datasets_and_repeats(tmp_path):
    other = other_dataset(tmp_path / "other.lmdb", ["x1", "x2"])
    d = RunDedup(str(tmp_path / "seen"), [("ds-other", other)], memtable=2)
    assert d.mark(["a", "b", "a", "x1"], [0, 1, 2, 3]) == [None, None, IN_RUN, "ds-other"]
    assert d.mark(["b", "c", "x2", "c", "a"], [4, 5, 6, 7, 8]) == [IN_RUN, None, "ds-other", IN_RUN, IN_RUN]
    assert len(d.seen) == 3                               # keys of other datasets are never recorded
    d.remove()


def test_the_same_stream_gives_the_same_decisions_after_a_restart(tmp_path):
    batches = stream(500, seed=3)
    decisions = []
    for _ in range(2):                                    # a resumed run starts the set over
        d = RunDedup(str(tmp_path / "seen"), memtable=40)
        decisions.append([d.mark(k, r) for k, r in batches])
        d.remove()
    assert decisions[0] == decisions[1]
    assert sum(m == IN_RUN for b in decisions[0] for m in b) > 50


def test_runs_hold_no_copy_of_their_records_in_memory(tmp_path):
    import vlmdata.keyindex.dedup as dedup_module

    seen = SeenKeys(str(tmp_path / "s"), memtable=600, fanout=2)
    for keys, rows in stream(5000, seed=5, repeat=0.0, batch=100):
        seen.first_rows(keys, rows)
    held = sum(r.filter.words.nbytes + r.fence_hi.nbytes + r.fence_lo.nbytes for r in seen._runs)
    assert seen._runs and held < 2 * len(seen)            # ~1.3 bytes per key, not the 24-byte records
    # while a run is written (a merge streams millions of records) nothing keeps the chunks written so far
    writer = dedup_module._RunWriter(str(tmp_path / "w.keys"), 4096)
    chunk = np.zeros(2048, dedup_module.RECORD)
    writer.write(chunk)
    assert all(f.base is None for f in writer.fences_hi + writer.fences_lo)
    writer.close()
    seen.remove()
