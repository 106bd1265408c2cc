"""Sharding from and to s3:// (moto's S3 server), and reading the result back from S3."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.s3 import moto_s3
from tests.helpers.shards import expected_tokens, read_jsonl, shard
from vlmdata import fsutil
from vlmdata.formats import Manifest, SampleIndex, read_sample
from vlmdata.ingest import inspect_dataset

pytestmark = pytest.mark.integration  # moto's S3 server


def test_s3_input_and_output(corrupt_llava_corpus, tmp_path):
    import s3fs

    records = read_jsonl(corrupt_llava_corpus / "data.jsonl")[:30]
    corrupt = json.loads((corrupt_llava_corpus / "corrupt.json").read_text())
    with moto_s3("bucket") as so:
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **so)
        for r in records:  # raw data on S3: relative refs resolve against s3://bucket/raw/
            for p in r["images"]:
                if (corrupt_llava_corpus / p).exists():
                    fs.pipe_file(f"bucket/raw/{p}", (corrupt_llava_corpus / p).read_bytes())
        fs.pipe_file("bucket/raw/data.jsonl", "".join(json.dumps(r) + "\n" for r in records).encode())
        m = shard("s3://bucket/raw/data.jsonl", "s3://bucket/ds", storage_options=so, workers=2,
                  max_samples_per_shard=12)
        bad = [r["id"] for r in records if r["id"] in corrupt]
        assert m.stats["input_rows"] == 30 and m.stats["skipped_total"] == len(bad)
        assert m.num_samples == 30 - len(bad) and len(m.shards) == 3

        loaded = Manifest.load("s3://bucket/ds", so)
        assert loaded.shards == m.shards
        assert fs.exists("bucket/ds/planning.npz") and fs.exists("bucket/ds/_jobs/job-000002.json")
        assert not [p for p in fs.find("bucket/ds") if ".tmp-" in p]
        by_id = {r["id"]: r for r in records}
        n = 0
        for info in loaded.shards:
            data = fsutil.read_bytes(f"s3://bucket/ds/{info.name}", so)
            assert len(data) == info.bytes
            index = SampleIndex.load(f"s3://bucket/ds/{info.index}", so)
            for i in range(len(index)):
                rec = read_sample(data, index, i)
                src = by_id[rec.key]
                assert [bytes(b) for b in rec.images] == [(corrupt_llava_corpus / p).read_bytes() for p in src["images"]]
                np.testing.assert_array_equal(rec.tokens, expected_tokens(src))
                n += 1
        assert n == m.num_samples
        assert f"samples {m.num_samples}" in inspect_dataset("s3://bucket/ds", so, samples=1)
        again = shard("s3://bucket/raw/data.jsonl", "s3://bucket/ds", storage_options=so, resume=True,
                      max_samples_per_shard=12)
        assert again.stats["resumed_jobs"] == 3
