"""RunDedup: first occurrence wins within a run (also inside one batch); keys of other datasets are named;
a run streamed again after a crash reaches the same decisions; another run's or a damaged file starts over."""
import numpy as np

from vlmdata.keyindex import IN_RUN, KeyIndex, KeySorter, RunDedup, write_key_index
from vlmdata.keyindex.codec import encode_locations


def other_dataset(path, keys):
    with KeySorter() as sorter:
        sorter.add(np.asarray([k.encode() for k in keys], dtype="S"), encode_locations(0, np.arange(len(keys))))
        write_key_index(str(path), sorter.sorted_blocks(), {})
    return KeyIndex(str(path))


def test_first_occurrence_wins_and_other_datasets_are_named(tmp_path):
    other = other_dataset(tmp_path / "other.lmdb", ["x1", "x2"])
    d = RunDedup(str(tmp_path / "seen.lmdb"), "run-a", [("ds-other", other)])
    assert d.mark(["a", "b", "a", "x1"], [0, 1, 2, 3]) == [None, None, IN_RUN, "ds-other"]
    assert d.mark(["b", "c", "x2", "c"], [4, 5, 6, 7]) == [IN_RUN, None, "ds-other", IN_RUN]
    assert len(d) == 3                                    # a, b, c: keys of other datasets never enter the file
    d.close()


def test_a_run_streamed_again_after_a_crash_decides_the_same(tmp_path):
    path = str(tmp_path / "seen.lmdb")
    batches = [(["k1", "k2", "k1"], [0, 1, 2]), (["k3", "k2"], [3, 4]), (["k4", "k1"], [5, 6])]
    d = RunDedup(path, "run-a")
    first = [d.mark(*batches[0]), d.mark(*batches[1])]
    d.close()                                             # "crash" before the last batch
    again = RunDedup(path, "run-a")
    assert [again.mark(*b) for b in batches] == first + [[None, IN_RUN]]
    again.close()


def test_another_runs_file_or_a_damaged_one_starts_over(tmp_path):
    path = str(tmp_path / "seen.lmdb")
    d = RunDedup(path, "run-a")
    d.mark(["k1"], [0])
    d.close()
    other = RunDedup(path, "run-b")                       # a different run: nothing carried over
    assert other.mark(["k1"], [5]) == [None]
    other.close()
    with open(path, "wb") as f:
        f.write(b"garbage" * 100)
    fresh = RunDedup(path, "run-b")
    assert fresh.mark(["k1"], [5]) == [None] and len(fresh) == 1
    fresh.remove()
    assert not (tmp_path / "seen.lmdb").exists()
