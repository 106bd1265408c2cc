"""An object-store outage costs time, never samples: moto's S3 server behind a loopback proxy that refuses
connections for a few seconds, once while the dataset opens (manifest, planning columns) and once mid-epoch
(shard indices and shards, read by two DataLoader workers)."""
from __future__ import annotations

from collections import Counter
from urllib.parse import urlparse

import pytest

from tests.helpers.dataset import make_samples, write_dataset
from tests.helpers.proxy import FlakyProxy
from tests.helpers.s3 import moto_s3, upload_dir
from vlmdata.cache import RetryPolicy
from vlmdata.loading import DatasetOptions, VLMDataset, make_loader

pytestmark = pytest.mark.integration  # moto's S3 server, DataLoader workers

OUTAGE_SECONDS = 3.0
# the deadline is scaled down with the outage (the default is minutes, for outages of minutes)
RETRY = RetryPolicy(deadline=60.0, base_delay=0.05, max_delay=0.5)


def test_store_outage_at_open_and_mid_epoch_loses_no_sample(tmp_path):
    samples = make_samples(96, seed=3)
    root = tmp_path / "ds"
    write_dataset(str(root), samples, shard_size=4)           # 24 shards: reads all through the epoch
    with moto_s3() as so:
        url = upload_dir(root, "outage-test", "ds", so)   # a bucket of its own (moto keeps state per process)
        with FlakyProxy(urlparse(so["endpoint_url"]).port) as proxy:
            # the client library's own retries are kept short, so the outage outlasts them (as a real
            # outage of minutes outlasts its default retries)
            opts = {**so, "endpoint_url": proxy.endpoint,
                    "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 10}}
            proxy.outage(OUTAGE_SECONDS)
            ds = VLMDataset(url, max_tokens=512, max_images=6, image_size=56, rank=0, world_size=1,
                            options=DatasetOptions(window_shards=2, storage_options=opts, retry=RETRY))
            assert proxy.refused > 0                           # opening met the outage, and waited it out
            refused_at_open = proxy.refused
            keys, skipped = [], Counter()
            for n, batch in enumerate(make_loader(ds, num_workers=2)):
                if n == 3:
                    proxy.outage(OUTAGE_SECONDS)
                keys += batch["sample_keys"]
                skipped.update(batch["stats"]["skipped"])
            assert proxy.outages == 2 and proxy.refused > refused_at_open   # the workers' reads met it too
    assert dict(skipped) == {}
    assert sorted(keys) == sorted(s.key for s in samples)
