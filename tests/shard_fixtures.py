"""Helpers for the sharding tests (issue 2): running `shard_dataset`, reading output back, S3 via moto."""
from __future__ import annotations

import glob
import io
import json
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from vlmdata.formats import Manifest
from vlmdata.ingest import ShardConfig, shard_dataset
from vlmdata.text import ByteTokenizer, encode_conversation

# what gen_raw.py calls each corruption -> the reason vlmdata counts it under
GEN_RAW_REASONS = {"truncated": "truncated_image", "empty": "empty_file", "missing": "missing_file",
                   "not_jpeg": "not_an_image", "bad_text": "bad_text"}


def shard(inputs, out, **kw) -> Manifest:
    """shard_dataset with test defaults (inline workers unless given)."""
    kw.setdefault("workers", 0)
    if not isinstance(inputs, list):
        inputs = [inputs]
    return shard_dataset(ShardConfig(inputs=[str(i) for i in inputs], output=str(out), **kw))


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def wds_samples(out: Path) -> dict[str, dict]:
    """Every sample of the output's tars, read by the `webdataset` library (no decoding)."""
    import webdataset as wds

    urls = sorted(glob.glob(str(out / "*.tar")))
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    out_samples = {}
    for s in ds:
        assert s["__key__"] not in out_samples, f"duplicate key {s['__key__']}"
        out_samples[s["__key__"]] = s
    return out_samples


def expected_tokens(rec: dict) -> np.ndarray:
    """The tokens vlmdata must write for a gen_raw LLaVA record (byte tokenizer)."""
    roles = {"human": "user", "gpt": "assistant"}
    turns = [(roles[t["from"]], t["value"]) for t in rec["conversations"]]
    return encode_conversation(ByteTokenizer(), turns, len(rec["images"]))


def load_npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def tar_tree(out: Path) -> dict[str, bytes]:
    """Shard data/index files of a dataset dir (name -> bytes), for byte-identical comparisons."""
    files = {}
    for p in sorted(os.listdir(out)):
        if p.startswith("shard-"):
            files[p] = (out / p).read_bytes()
    return files


@contextmanager
def moto_s3(bucket: str):
    """A real S3 API on 127.0.0.1 (moto's server) with `bucket` created; yields s3fs storage_options."""
    import s3fs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    opts = {"endpoint_url": f"http://{host}:{port}", "key": "testing", "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"}}
    try:
        import boto3

        boto3.client("s3", endpoint_url=opts["endpoint_url"], aws_access_key_id="testing",
                     aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=bucket)
        s3fs.S3FileSystem.clear_instance_cache()
        yield opts
    finally:
        server.stop()
