"""Bad data at run time: skipped and counted, the epoch goes on, nothing hangs."""
import os
import shutil

import pytest

from tests.helpers.dataset import make_samples, write_dataset
from tests.helpers.s3 import moto_s3
from vlmdata.cache import RetryPolicy
from vlmdata.loading import DatasetOptions, VLMDataset, make_loader

OPTS = DatasetOptions(window_shards=2, retry=RetryPolicy(attempts=2, base_delay=0.01, seed=0))


def load(root, workers=2, **kw):
    ds = VLMDataset(root, max_tokens=512, max_images=6, image_size=56, rank=0, world_size=1, options=OPTS, **kw)
    batches = list(make_loader(ds, num_workers=workers))
    keys = [k for b in batches for k in b["sample_keys"]]
    skipped = {}
    for b in batches:
        for reason, n in b["stats"]["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + n
    return keys, skipped


@pytest.fixture(scope="module")
def samples():
    return make_samples(48, seed=7)


def test_corrupt_image_costs_exactly_one_sample(tmp_path, samples):
    bad = next(s.key for s in samples if len(s.images) >= 1)
    root = str(tmp_path / "ds")
    write_dataset(root, samples, shard_size=8, corrupt_keys=frozenset([bad]))
    keys, skipped = load(root)
    assert sorted(keys) == sorted(s.key for s in samples if s.key != bad)
    assert skipped == {"corrupt_image": 1}


def test_truncated_shard_skipped_and_counted(tmp_path, samples):
    root = str(tmp_path / "ds")
    m = write_dataset(root, samples, shard_size=8)
    path = os.path.join(root, m.shards[2].name)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    keys, skipped = load(root)
    lost = set(s.key for s in samples[16:24])
    assert sorted(keys) == sorted(s.key for s in samples if s.key not in lost)
    assert skipped == {"corrupt_shard": 8}


def test_unreachable_shard_skipped_and_counted(tmp_path, samples):
    root = str(tmp_path / "ds")
    m = write_dataset(root, samples, shard_size=8)
    os.remove(os.path.join(root, m.shards[0].name))
    keys, skipped = load(root, workers=0)
    assert sorted(keys) == sorted(s.key for s in samples[8:])
    assert skipped == {"fetch_error": 8}


@pytest.mark.integration  # moto's S3 server
def test_s3_dataset_and_dead_endpoint(tmp_path, samples):
    import boto3

    root = str(tmp_path / "ds")
    write_dataset(root, samples, shard_size=8)
    with moto_s3(bucket="data") as so:
        endpoint = so["endpoint_url"]
        creds = dict(aws_access_key_id=so["key"], aws_secret_access_key=so["secret"],
                     region_name=so["client_kwargs"]["region_name"])
        s3 = boto3.client("s3", endpoint_url=endpoint, **creds)
        for name in os.listdir(root):
            s3.upload_file(os.path.join(root, name), "data", f"ds/{name}")
        opts = DatasetOptions(window_shards=2, storage_options=so, retry=OPTS.retry)
        ds = VLMDataset("s3://data/ds", max_tokens=512, max_images=6, image_size=56, rank=0, world_size=1,
                        options=opts)
        keys = [k for b in make_loader(ds, num_workers=2) for k in b["sample_keys"]]
        assert sorted(keys) == sorted(s.key for s in samples)
        # a shard object that disappears after planning: skipped, counted, no hang
        s3.delete_object(Bucket="data", Key="ds/shard-000001-00.tar")
        batches = list(make_loader(ds, num_workers=0))
        assert sum(b["stats"]["skipped"].get("fetch_error", 0) for b in batches) == 8
        assert len([k for b in batches for k in b["sample_keys"]]) == len(samples) - 8


def test_missing_dataset_gives_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="vlmdata shard"):
        VLMDataset(str(tmp_path / "nothing"), rank=0, world_size=1)
    root = str(tmp_path / "ds")
    write_dataset(root, make_samples(4, seed=1), shard_size=2)
    os.remove(os.path.join(root, "planning.npz"))
    with pytest.raises(FileNotFoundError, match="vlmdata index"):
        VLMDataset(root, rank=0, world_size=1)
    shutil.rmtree(root)
