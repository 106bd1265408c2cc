"""Random access by key: a sample read from its own byte range equals the sample read from the whole shard
(tar, gzip tar, memmap); VLMDataset.lookup finds keys in any dataset of a mix, or says why not."""
import gzip
import json
import os
import zlib

import numpy as np
import pytest

from tests.helpers.dataset import make_samples, write_dataset
from vlmdata import fsutil
from vlmdata.formats import Manifest, SampleIndex, read_sample
from vlmdata.keyindex import find_samples, lookup_sample, read_sample_at, rebuild_keys
from vlmdata.loading import VLMDataset


def gzip_shards(root):
    with open(os.path.join(root, "manifest.json")) as f:
        manifest = json.load(f)
    for shard in manifest["shards"]:
        with open(os.path.join(root, shard["name"]), "rb") as f:
            packed = gzip.compress(f.read())
        os.remove(os.path.join(root, shard["name"]))
        shard["name"] += ".gz"
        with open(os.path.join(root, shard["name"]), "wb") as f:
            f.write(packed)
        shard["bytes"], shard["crc32"] = len(packed), zlib.crc32(packed) & 0xFFFFFFFF
    manifest["layout"]["compression"] = "gzip"
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(manifest, f)


@pytest.mark.parametrize("kind", ["webdataset", "gzip", "memmap"])
def test_sample_read_by_key_equals_the_sample_in_its_shard(tmp_path, kind):
    root = str(tmp_path / kind)
    samples = make_samples(30, seed=4)
    write_dataset(root, samples, shard_size=8, kind="memmap" if kind == "memmap" else "webdataset")
    if kind == "gzip":
        gzip_shards(root)
    rebuild_keys(root)
    manifest = Manifest.load(root)
    for s, info in enumerate(manifest.shards):
        index = SampleIndex.load(os.path.join(root, info.index))
        if kind == "memmap":
            from vlmdata.formats import MemmapShard

            whole = MemmapShard(root, info)
            expected = [whole.read_sample(i, with_meta=True) for i in range(len(index))]
        else:
            data = fsutil.read_bytes(os.path.join(root, info.name))
            data = gzip.decompress(data) if kind == "gzip" else data
            expected = [read_sample(data, index, i, with_meta=True) for i in range(len(index))]
        for row, exp in enumerate(expected):
            got, loc = read_sample_at(root, manifest, s, row)
            assert (loc.shard, loc.row, loc.shard_name) == (s, row, info.name)
            assert got.key == exp.key and np.array_equal(got.tokens, exp.tokens) and got.sizes == exp.sizes
            assert [np.asarray(a).tobytes() for a in got.images] == [np.asarray(b).tobytes() for b in exp.images]
            assert got.meta == exp.meta == {"id": exp.key}
            assert lookup_sample(root, exp.key).location == loc


def test_dataset_lookup_across_a_mix(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_dataset(a, make_samples(12, seed=1, prefix="a"), shard_size=5)
    write_dataset(b, make_samples(12, seed=2, prefix="b") + make_samples(1, seed=3, prefix="a"), shard_size=5)
    ds = VLMDataset([(a, 1.0), (b, 1.0)], max_tokens=512, image_size=56)
    with pytest.raises(FileNotFoundError, match="--rebuild-keys"):
        ds.lookup("b00003")
    rebuild_keys(a)
    rebuild_keys(b)
    found = ds.lookup("b00003")
    assert found.source == 1 and found.record.key == "b00003" and found.location.dataset == b
    both = ds.lookup_all("a00000")                        # the key is in both datasets
    assert [f.source for f in both] == [0, 1]
    assert [f.location.shard for f in both] == [0, 2]
    with pytest.raises(KeyError, match="no sample with key 'zzz'"):
        ds.lookup("zzz")
    assert find_samples(a, "zzz") == []
