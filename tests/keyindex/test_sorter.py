"""The external key sort: argsort_keys equals numpy's stable string sort on awkward keys; runs spilled to disk
merge into one stream in key order with equal keys in arrival order; errors in the merge thread surface."""
import numpy as np
import pytest

from vlmdata.keyindex import KeySorter, argsort_keys, encode_locations


def awkward_keys(rng, n):
    prefix = [b"laion-000", b"laion-00", b"cc3m-", b"", b"laion-000000000000000000-"]
    keys = [prefix[int(rng.integers(len(prefix)))] + str(int(rng.integers(0, 3000))).encode() for _ in range(n)]
    keys += [b"", b"a", b"a" * 40, b"a" * 41]          # empty, prefixes of each other, beyond a word
    return np.asarray(keys, dtype="S")


def test_argsort_keys_is_numpys_stable_sort():
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 500, 5000):
        keys = awkward_keys(rng, n)
        assert np.array_equal(argsort_keys(keys), np.argsort(keys, kind="stable"))
    same = np.asarray([b"k"] * 7, dtype="S")
    assert argsort_keys(same).tolist() == list(range(7))


@pytest.mark.parametrize("run_keys", [10**6, 997])
def test_runs_merge_in_key_order_with_equal_keys_in_arrival_order(run_keys):
    rng = np.random.default_rng(1)
    keys = awkward_keys(rng, 6000)
    vals = encode_locations(np.arange(len(keys)) // 100, np.arange(len(keys)) % 100)
    with KeySorter(run_keys=run_keys) as sorter:
        for i in range(0, len(keys), 333):
            sorter.add(keys[i:i + 333], vals[i:i + 333])
        blocks = list(sorter.sorted_blocks(block=256))
    got_k = np.concatenate([b[0] for b in blocks])
    got_v = np.concatenate([b[1] for b in blocks])
    order = np.argsort(keys, kind="stable")
    assert got_k.tolist() == keys[order].tolist()
    pairs = sorted(zip(got_k.tolist(), got_v.tolist()))          # the same (key, location) pairs ...
    assert pairs == sorted(zip(keys.tolist(), vals.tolist()))
    if run_keys > len(keys):                                      # ... and, in one run, locations in order
        assert got_v.tolist() == vals[order].tolist()


def test_mismatched_pairs_and_merge_errors_are_reported():
    sorter = KeySorter(run_keys=4)
    with pytest.raises(ValueError, match="values"):
        sorter.add(np.asarray([b"a"], dtype="S"), encode_locations(0, np.arange(2)))
    sorter.add(np.asarray([b"b", b"a", b"c", b"d", b"e"], dtype="S"), encode_locations(0, np.arange(5)))
    sorter.add(np.asarray([b"f"], dtype="S"), encode_locations(1, np.arange(1)))
    sorter._runs.append(("/nonexistent/keys.npy", "/nonexistent/vals.npy"))
    with pytest.raises(FileNotFoundError):
        list(sorter.sorted_blocks())
    sorter.close()
