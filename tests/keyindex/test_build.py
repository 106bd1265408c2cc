"""keys.lmdb written by `vlmdata shard` with planning.npz in one pass: every key at its shard and row; a missing
index says how to build it, a stale one is refused, a rebuilt one is the same; a dataset on S3 is looked up
through a local copy of its index."""
import os
import shutil

import numpy as np
import pytest

from tests.helpers.s3 import moto_s3, upload_dir
from tests.helpers.shards import shard
from vlmdata.formats import Manifest, SampleIndex, concat_planning_columns
from vlmdata.keyindex import KEYS_NAME, find_samples, open_dataset_keys, rebuild_keys


@pytest.fixture(scope="module")
def sharded(small_llava_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("keys") / "ds"
    m = shard(small_llava_corpus / "data.jsonl", out, max_samples_per_shard=25)
    return out, m


def test_every_key_is_found_at_its_shard_and_row_and_planning_matches(sharded):
    out, m = sharded
    ix = open_dataset_keys(str(out))
    indices = [SampleIndex.load(str(out / s.index)) for s in m.shards]
    assert len(ix) == m.num_samples == sum(len(i) for i in indices) and len(m.shards) == 5
    for s, index in enumerate(indices):
        for row, key in enumerate(index.keys()):
            assert ix.locations(key) == [(s, row)]
    assert ix.meta["duplicates"] == 0 and ix.meta["shards"] == 5
    assert not (out / "_jobs" / "seen-keys").exists()                # the run's key set is gone
    with np.load(out / "planning.npz") as z:                           # streamed: what merging in memory gave
        for name, values in concat_planning_columns(indices).items():
            assert np.array_equal(z[name], values) and z[name].dtype == values.dtype, name


def test_missing_index_says_how_to_build_it_and_a_stale_one_is_refused(sharded, tmp_path):
    out, m = sharded
    copy = tmp_path / "ds"
    shutil.copytree(out, copy)
    os.remove(copy / KEYS_NAME)
    with pytest.raises(FileNotFoundError, match="--rebuild-keys"):
        open_dataset_keys(str(copy))
    stats = rebuild_keys(str(copy))
    assert stats["entries"] == m.num_samples
    a, b = open_dataset_keys(str(out)), open_dataset_keys(str(copy))
    key = SampleIndex.load(str(out / m.shards[3].index)).keys()[7]
    assert a.locations(key) == b.locations(key) == [(3, 7)]
    fewer = Manifest.load(str(copy))
    fewer.shards = fewer.shards[:-1]
    fewer.save(str(copy))
    with pytest.raises(ValueError, match="another version"):
        open_dataset_keys(str(copy))


@pytest.mark.integration
def test_dataset_on_s3_is_looked_up_through_a_local_copy_of_its_index(sharded, tmp_path, monkeypatch):
    out, m = sharded
    monkeypatch.setenv("VLMDATA_KEYS_CACHE", str(tmp_path / "cache"))
    key = SampleIndex.load(str(out / m.shards[2].index)).keys()[4]
    local = find_samples(str(out), key)
    with moto_s3() as so:
        url = upload_dir(out, "bucket", "ds", so)
        found = find_samples(url, key, so)
        assert len(os.listdir(tmp_path / "cache")) == 1                 # downloaded once ...
        assert find_samples(url, key, so)[0].location.row == 4          # ... and reused
    assert len(found) == len(local) == 1
    got, exp = found[0], local[0]
    assert (got.location.shard, got.location.row, got.location.offset) == (2, 4, exp.location.offset)
    assert np.array_equal(got.record.tokens, exp.record.tokens)
    assert [bytes(i) for i in got.record.images] == [bytes(i) for i in exp.record.images]
    assert got.record.meta == exp.record.meta and got.record.meta["id"] == key


@pytest.mark.integration
def test_a_keys_cache_of_another_user_or_a_planted_copy_is_refused(sharded, tmp_path, monkeypatch):
    from vlmdata.errors import UnsafePathError
    from vlmdata.keyindex import lookup as lookup_module

    lookup_module._OPEN.clear()                            # an index another test opened for the same URL
    out, m = sharded
    key = SampleIndex.load(str(out / m.shards[0].index)).keys()[0]
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, 12345, 12345)                           # e.g. VLMDATA_KEYS_CACHE=/tmp/keys, made by another user
    monkeypatch.setenv("VLMDATA_KEYS_CACHE", str(cache))
    with moto_s3() as so:
        url = upload_dir(out, "bucket", "ds", so)
        with pytest.raises(UnsafePathError, match="uid 12345"):
            find_samples(url, key, so)
        os.chown(cache, 0, 0)
        assert find_samples(url, key, so)[0].key == key
        (copy,) = os.listdir(cache)
        os.chown(cache / copy, 12345, 12345)                 # a copy someone else put under the expected name
        lookup_module._OPEN.clear()
        with pytest.raises(UnsafePathError, match="uid 12345"):
            find_samples(url, key, so)
