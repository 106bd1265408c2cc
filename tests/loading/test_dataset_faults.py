"""Bad data at run time: skipped and counted, the epoch goes on, nothing hangs."""
import io
import os
import shutil
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from tests.helpers.dataset import make_samples, write_dataset
from tests.helpers.s3 import moto_s3
from vlmdata.cache import RetryPolicy
from vlmdata.decode import FixedPolicy
from vlmdata.formats import SampleIndex
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


def solid_ppm_samples(n: int) -> list:
    """n samples of one 32x32 solid-colour PPM each (every image member the same size), the same text."""
    from tests.helpers.dataset import TOK, RawSample
    from vlmdata.formats import EncodedImage
    from vlmdata.text import encode_conversation

    out = []
    for i in range(n):
        colour = np.array([i * 15, 255 - i * 15, (i * 40) % 256], np.uint8)
        arr = np.broadcast_to(colour, (32, 32, 3)).copy()
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="PPM")
        tokens = encode_conversation(TOK, [("user", "<image>\nColour?"), ("assistant", "a colour")], 1)
        out.append(RawSample(f"c{i:05d}", tokens, [EncodedImage(buf.getvalue(), "ppm", 32, 32)], [arr]))
    return out


def test_shard_rewritten_in_place_mid_epoch_never_delivers_another_samples_bytes(tmp_path):
    """Same size, same tar headers, image payloads rotated: the member-name check cannot see it."""
    root = str(tmp_path / "ds")
    samples = solid_ppm_samples(16)
    colours = {s.key: s.pixels[0][0, 0].tolist() for s in samples}
    m = write_dataset(root, samples, shard_size=8)
    ds = VLMDataset(root, max_tokens=48, max_images=2, image_size=FixedPolicy(28, 14), rank=0, world_size=1,
                    options=DatasetOptions(window_shards=2))
    delivered, skipped, wrong = [], Counter(), []
    for n, b in enumerate(make_loader(ds, num_workers=0)):
        skipped.update(b["stats"]["skipped"])
        for j, key in enumerate(b["sample_keys"]):
            delivered.append(key)
            got = b["pixel_values"][j].reshape(3, -1).T.unique(dim=0).tolist()
            if got != [colours[key]]:
                wrong.append(key)
        if n == 0:            # a reader has the shards open: rotate every image payload of each, in place
            for info in m.shards:
                ix = SampleIndex.load(os.path.join(root, info.index))
                path = os.path.join(root, info.name)
                data = open(path, "rb").read()
                payloads = [data[o:o + z] for o, z in zip(ix.img_offset.tolist(), ix.img_size.tolist())]
                with open(path, "r+b") as f:
                    for o, p in zip(ix.img_offset.tolist(), payloads[1:] + payloads[:1]):
                        f.seek(o)
                        f.write(p)
                assert os.path.getsize(path) == info.bytes
    assert wrong == []
    assert len(delivered) == len(set(delivered)) and len(delivered) + sum(skipped.values()) == len(samples)
    assert skipped["shard_changed"] > 0 and set(skipped) <= {"shard_changed", "corrupt_shard"}   # opened later: CRC


@pytest.mark.parametrize("kind", ["webdataset", "memmap"])
def test_shard_cut_short_in_place_mid_epoch_is_counted_not_a_signal(tmp_path, kind):
    """Shards truncated to half their size while a DataLoader worker has them mapped: touching a mapped page past
    the new end would kill the worker with SIGBUS. The reader checks the file before it copies a sample, so the
    epoch ends, the samples concerned are counted (shard_changed, or corrupt_shard for shards opened later) and
    nothing is lost or delivered twice."""
    root = str(tmp_path / "ds")
    samples = solid_ppm_samples(16)
    m = write_dataset(root, samples, shard_size=4, kind=kind, image_size=28)
    ds = VLMDataset(root, max_tokens=48, max_images=2, image_size=FixedPolicy(28, 14), rank=0, world_size=1,
                    options=DatasetOptions(window_shards=2))
    delivered, skipped = [], Counter()
    for n, b in enumerate(make_loader(ds, num_workers=1)):
        skipped.update(b["stats"]["skipped"])
        delivered.extend(b["sample_keys"])
        if n == 0:
            for info in m.shards:
                with open(os.path.join(root, info.name), "r+b") as f:
                    f.truncate(info.bytes // 2)
    assert len(delivered) == len(set(delivered)) and len(delivered) + sum(skipped.values()) == len(samples)
    assert skipped["shard_changed"] > 0 and set(skipped) <= {"shard_changed", "corrupt_shard"}
