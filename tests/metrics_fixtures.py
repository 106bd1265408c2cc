"""Helpers for the metrics and dashboard tests: a small sharded corpus, its ground truth, Chromium."""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from conftest import generate_corpus

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--hide-scrollbars",
                  "--disable-dev-shm-usage", "--mute-audio")


@dataclass
class Corpus:
    """A sharded dataset directory and what one epoch over it must deliver."""

    root: Path
    samples: int
    images: int
    shards: int


def build_sharded_corpus(tmp: Path, samples: int = 60, per_shard: int = 10, seed: int = 3) -> Corpus:
    """gen_raw.py corpus -> `vlmdata shard` (engineer A's shard_dataset) -> dataset directory."""
    from vlmdata.ingest import ShardConfig, shard_dataset

    raw = generate_corpus(tmp / "raw", samples=samples, seed=seed)
    manifest = shard_dataset(ShardConfig(inputs=[str(raw / "data.jsonl")], output=str(tmp / "ds"),
                                         max_samples_per_shard=per_shard, workers=1))
    assert manifest.num_samples == samples, manifest.stats
    return Corpus(tmp / "ds", manifest.num_samples, manifest.num_images, len(manifest.shards))


def planned_real_tokens(corpus: Corpus, policy) -> int:
    """Real tokens of one epoch from the index alone: text tokens + the policy's tokens per image."""
    with np.load(corpus.root / "planning.npz", allow_pickle=False) as z:
        text = int(z["text_tokens"].astype(np.int64).sum())
        w, h = z["width"], z["height"]
    image = int(np.asarray(policy.tokens(w, h), dtype=np.int64).sum()) if len(w) else 0
    return text + image


@contextmanager
def moto_s3() -> Iterator[dict]:
    """A real S3 API on 127.0.0.1 (moto's server); yields s3fs storage_options."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield {"endpoint_url": f"http://{host}:{port}", "key": "testing", "secret": "testing",
               "client_kwargs": {"region_name": "us-west-2"}}
    finally:
        server.stop()


def upload_dir(local: Path, bucket: str, prefix: str, opts: dict) -> str:
    """Copy a dataset directory into s3://bucket/prefix (bucket created); returns the URL."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
    fs.mkdir(bucket)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            fs.pipe_file(f"{bucket}/{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())
    return f"s3://{bucket}/{prefix}"


def chromium() -> str:
    """Debian's chromium; a missing browser fails the test (it is a requirement, not an option)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium not found: the dashboard browser test needs Debian's chromium "
                    "(`apt-get install -y chromium`; tools/run_tests.sh installs it when run as root)")
    return path


def run_chromium(url: str, profile: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


class ElementIndex(HTMLParser):
    """Attributes of every element with an id or a data-chart attribute, from a DOM dump."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, dict] = {}
        self.charts: dict[str, dict] = {}
        self.body: dict = {}

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = {k: (v or "") for k, v in attrs}
        if tag == "body":
            self.body = a
        if "id" in a:
            self.by_id[a["id"]] = a
        if "data-chart" in a:
            self.charts[a["data-chart"]] = a


def parse_dom(html: str) -> ElementIndex:
    idx = ElementIndex()
    idx.feed(html)
    return idx
