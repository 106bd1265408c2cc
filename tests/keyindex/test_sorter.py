"""The key sort: argsort_keys equals numpy's stable string sort on awkward keys; pairs partitioned into key ranges
(and ranges too large for memory sorted in runs) come out as a stable Python sort of the pairs, for random,
increasing, decreasing, all-equal, heavy-duplicate and skewed-prefix keys, holding a bounded number of pairs;
errors in the sorting thread surface."""
import os

import numpy as np
import pytest

from vlmdata.keyindex import KeyRanges, KeySorter, argsort_keys, encode_locations


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
    assert got_v.tolist() == vals[order].tolist()                # equal keys in arrival order, in every path


def test_mismatched_pairs_and_merge_errors_are_reported():
    sorter = KeySorter(run_keys=4)
    with pytest.raises(ValueError, match="values"):
        sorter.add(np.asarray([b"a"], dtype="S"), encode_locations(0, np.arange(2)))
    sorter.add(np.asarray([b"b", b"a", b"c", b"d", b"e"], dtype="S"), encode_locations(0, np.arange(5)))
    sorter.add(np.asarray([b"f"], dtype="S"), encode_locations(1, np.arange(1)))
    sorter._wait()
    for name in os.listdir(sorter._dir):                    # the spilled buckets vanish
        os.unlink(os.path.join(sorter._dir, name))
    with pytest.raises(FileNotFoundError):
        list(sorter.sorted_blocks())
    sorter.close()


def key_set(kind: str, n: int, rng) -> list[bytes]:
    if kind == "random":
        return [b"laion2b-%016x" % int(x) for x in rng.integers(0, 2 ** 63, n)]
    if kind == "increasing":                                  # `{source}-{n}` in shard order
        return [b"src%03d-%06d" % (i // 2000, i % 2000) for i in range(n)]
    if kind == "decreasing":
        return [b"k%07d" % (n - i) for i in range(n)]
    if kind == "all-equal":
        return [b"same-key"] * n
    if kind == "heavy-duplicate":                             # a few keys, one of them most of the pairs
        return [b"dup" if x < 6 else b"k%d" % x for x in rng.integers(0, 10, n)]
    # skewed prefix: the first buffer is all one source, later ones mostly another (random order inside)
    return [(b"a-" if i < n // 8 else b"z-" if x % 10 else b"m-") + b"%08x" % int(x)
            for i, x in enumerate(rng.integers(0, 2 ** 32, n))]


KINDS = ["random", "increasing", "decreasing", "all-equal", "heavy-duplicate", "skewed-prefix"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [300, 4000, 30000])            # in memory; buckets; buckets outgrowing memory
def test_output_is_a_stable_python_sort_of_the_pairs_in_bounded_memory(kind, n):
    rng = np.random.default_rng(n)
    keys = key_set(kind, n, rng)
    vals = encode_locations(np.arange(n) // 700, np.arange(n) % 700)
    run_keys, bucket_keys = 1500, 2500     # runs longer than a merge step (1024)
    with KeySorter(run_keys=run_keys, buckets=8, bucket_keys=bucket_keys) as sorter:
        for i in range(0, n, 250):
            sorter.add(np.asarray(keys[i:i + 250], dtype="S"), vals[i:i + 250])
        blocks = list(sorter.sorted_blocks(block=300))
    expected = sorted(range(n), key=lambda i: keys[i])        # Python's sort is stable: equal keys by arrival
    assert np.concatenate([b[0] for b in blocks]).tolist() == [keys[i] for i in expected]
    assert np.concatenate([b[1] for b in blocks]).tolist() == vals[expected].tolist()
    assert all(len(b[0]) <= 300 for b in blocks)
    assert sorter.max_sorted <= max(run_keys + 250, bucket_keys)  # no bucket larger than memory sorted whole
    if n > run_keys:
        assert sorter.max_sorted > 0


def test_key_ranges_put_every_key_in_a_range_that_follows_key_order():
    rng = np.random.default_rng(3)
    sample = np.asarray([b"laion2b-%08x" % int(x) for x in rng.integers(0, 2 ** 32, 2000)], dtype="S")
    ranges = KeyRanges.from_sample(sample, buckets=16)
    assert ranges.prefix == b"laion2b-" and ranges.count == 16
    others = [b"", b"a", b"laion", b"laion2b-", b"laion2b-\xff", b"laion2c", b"zzz", b"laion2b-0" * 5]
    keys = np.asarray(sample.tolist() + others, dtype="S")
    ids = ranges.bucket_of(keys)
    order = np.argsort(keys, kind="stable")
    assert np.all(np.diff(ids[order].astype(int)) >= 0)     # ranges never go back in key order
    sizes = np.bincount(ranges.bucket_of(sample), minlength=16)
    assert sizes.max() < 3 * len(sample) / 16                # quantiles: no range far above its share
    with pytest.raises(ValueError, match="buckets"):
        KeyRanges.from_sample(sample, buckets=257)
