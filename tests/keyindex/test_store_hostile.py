"""keys.lmdb against truncation, foreign files and address-space limits: a truncated or foreign file is a clear
error (exit 2), never a SIGBUS; the writer's map follows the data and RLIMIT_AS, so sharding, resume and lookup
work under `ulimit -v`."""
from __future__ import annotations

import os
import resource
import subprocess
import sys

import numpy as np
import pytest

import vlmdata.keyindex.store as store_module
from tests.helpers.dataset import make_samples, write_dataset
from vlmdata.cli import main
from vlmdata.errors import BadKeyIndexError, ConfigError
from vlmdata.formats import Manifest
from vlmdata.ingest import ShardConfig, shard_dataset
from vlmdata.keyindex import KeyIndex, encode_locations, find_samples, write_key_index

LIMIT = 8 << 30                     # a cluster's `ulimit -v 8388608`


def cli(*args: str, limit: int | None = None) -> subprocess.CompletedProcess:
    def set_limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run([sys.executable, "-m", "vlmdata", *args], capture_output=True, text=True, timeout=300,
                          preexec_fn=set_limit if limit else None)


@pytest.fixture
def dataset(tmp_path):
    root = str(tmp_path / "ds")
    write_dataset(root, make_samples(400, seed=1, long_text=40), shard_size=100)
    assert main(["index", root, "--rebuild-keys"]) == 0
    return root


def truncate(path: str, pages: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(pages * 4096)


def test_a_truncated_key_index_is_an_error_not_a_signal(dataset):
    path = os.path.join(dataset, "keys.lmdb")
    assert os.path.getsize(path) > 4 * 4096
    truncate(path, 3)                                   # both meta pages kept, the tree's pages cut off
    r = cli("show", dataset, "s00007")
    assert r.returncode == 2, (r.returncode, r.stderr)  # not 135 (SIGBUS)
    assert "is truncated" in r.stderr and "vlmdata index --rebuild-keys" in r.stderr
    with pytest.raises(BadKeyIndexError, match="is truncated"):
        find_samples(dataset, "s00007")


def test_a_foreign_key_index_is_an_error(dataset):
    path = os.path.join(dataset, "keys.lmdb")
    with open(path, "wb") as f:
        f.write(np.random.default_rng(0).integers(0, 256, 64 << 10, dtype=np.uint8).tobytes())
    r = cli("show", dataset, "s00007")
    assert r.returncode == 2 and "not a vlmdata key index" in r.stderr
    with open(path, "wb") as f:
        f.write(b"")
    with pytest.raises(BadKeyIndexError, match="not a vlmdata key index"):
        KeyIndex(path)


def test_dedup_against_a_truncated_key_index_stops_before_the_run(dataset, small_llava_corpus, tmp_path):
    truncate(os.path.join(dataset, "keys.lmdb"), 3)
    cfg = ShardConfig(inputs=[str(small_llava_corpus / "data.jsonl")], output=str(tmp_path / "out"),
                      image_root=str(small_llava_corpus), workers=1, dedup_against=[dataset])
    with pytest.raises(ConfigError, match="is truncated"):
        shard_dataset(cfg)
    assert not os.path.exists(tmp_path / "out" / "manifest.json")


def test_the_writer_grows_its_map_when_full(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "INITIAL_MAP", 1 << 20)
    monkeypatch.setattr(store_module, "COMMIT_KEYS", 30_000)
    keys = np.array([b"k%09d" % i for i in range(100_000)])
    vals = encode_locations(np.arange(len(keys)) // 1000 + 1, np.arange(len(keys)) % 1000)
    path = str(tmp_path / "keys.lmdb")
    stats = write_key_index(path, [(keys[i:i + 25_000], vals[i:i + 25_000]) for i in range(0, len(keys), 25_000)],
                            {"signature": "x"})
    assert stats["entries"] == len(keys) and os.path.getsize(path) > 2 << 20      # the 1 MiB map grew twice at least
    ix = KeyIndex(path)
    assert len(ix) == len(keys) and ix.contains_encoded([keys[0], keys[-1], b"nope"]) == [True, True, False]
    assert ix.locations(b"k000054321") == [(55, 321)]


def test_sharding_resume_and_lookup_under_an_address_space_limit(small_llava_corpus, tmp_path):
    out = str(tmp_path / "out")
    args = ["shard", str(small_llava_corpus / "data.jsonl"), "-o", out, "--workers", "1",
            "--max-samples-per-shard", "40"]
    r = cli(*args, limit=LIMIT)
    assert r.returncode == 0, r.stderr[-2000:]
    m = Manifest.load(out)
    assert m.num_samples > 0 and os.path.getsize(os.path.join(out, "keys.lmdb")) < 64 << 20
    r = cli(*args, "--resume", limit=LIMIT)
    assert r.returncode == 0, r.stderr[-2000:]
    key = m.shards and find_samples(out, _first_key(out, m))[0].key
    r = cli("show", out, key, limit=LIMIT)
    assert r.returncode == 0 and r.stdout.startswith(f"sample {key}"), r.stderr[-2000:]


def _first_key(root: str, m: Manifest) -> str:
    from vlmdata.formats import SampleIndex

    return SampleIndex.load(os.path.join(root, m.shards[0].index)).keys()[0]
