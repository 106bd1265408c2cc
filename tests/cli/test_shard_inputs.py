"""`vlmdata shard` on inputs it does not read as rows, and on a datasets folder: WebDataset tars are refused
with the exact `vlmdata index` command (which then works); hf:// without the Hub or without huggingface_hub
is one line, exit 2, fast; a save_to_disk folder shards like its JSONL."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time

import pytest

from tests.helpers.corpus import generate_corpus
from tests.helpers.shards import read_jsonl, shard, stored_members
from vlmdata.formats import Manifest


def vlmdata(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vlmdata", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


@pytest.fixture(scope="module")
def tar_folder(tmp_path_factory):
    """img2dataset's layout: NNNNN.tar of (key.jpg, key.txt) beside NNNNN.parquet and NNNNN_stats.json."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import webdataset as wds

    root = tmp_path_factory.mktemp("i2d")
    corpus = generate_corpus(root / "corpus", 6, seed=9, fmt="caption")
    rows = read_jsonl(corpus / "data.jsonl")
    shards = root / "my shards"
    shards.mkdir()
    for n, part in enumerate((rows[:3], rows[3:])):
        with wds.TarWriter(str(shards / f"{n:05d}.tar")) as w:
            for r in part:
                w.write({"__key__": r["id"], "jpg": (corpus / r["image"]).read_bytes(), "txt": r["caption"]})
        pq.write_table(pa.table({"key": [r["id"] for r in part], "caption": [r["caption"] for r in part]}),
                       shards / f"{n:05d}.parquet")
        (shards / f"{n:05d}_stats.json").write_text("{}")
    return shards


def _refusal(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    found = re.findall(r"`(vlmdata index [^`]+)`", lines[0])
    assert len(found) == 1, lines[0]
    return found[0]


def test_tars_are_refused_with_the_index_command_that_works(tar_folder, tmp_path):
    folder = str(tar_folder)
    expected = f"vlmdata index {shlex.quote(folder)}"
    assert _refusal(vlmdata("shard", folder, "-o", str(tmp_path / "a"))) == expected
    assert _refusal(vlmdata("shard", f"{folder}/00000.tar", "-o", str(tmp_path / "b"))) == expected
    assert _refusal(vlmdata("shard", f"{folder}/{{00000..00001}}.tar", "-o", str(tmp_path / "c"))) == expected
    assert _refusal(vlmdata("shard", f"{folder}/00000.tar", f"{folder}/00001.tar", "-o", str(tmp_path / "d"))) \
        == expected
    rel = _refusal(vlmdata("shard", "my shards/*.tar", "-o", str(tmp_path / "e"), cwd=tar_folder.parent))
    assert rel == "vlmdata index 'my shards'"
    assert not any(os.path.exists(tmp_path / x) for x in "abcde")
    r = subprocess.run([sys.executable, "-m", *shlex.split(expected)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert Manifest.load(folder).num_samples == 6


def test_hf_paths_without_the_hub_are_one_line(tmp_path):
    env = {**os.environ, "HF_HUB_ETAG_TIMEOUT": "3", "HF_HUB_DOWNLOAD_TIMEOUT": "3"}
    env.pop("HF_HUB_OFFLINE", None)
    t0 = time.monotonic()
    r = vlmdata("shard", "hf://datasets/vlmdata-test/none/data.jsonl", "-o", str(tmp_path / "o"),
                "--remote-timeout", "10", env=env)
    assert time.monotonic() - t0 < 60
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: cannot read input hf://datasets/vlmdata-test/none/data.jsonl: ")
    assert "Hugging Face Hub cannot be reached" in r.stderr
    r = vlmdata("shard", "hf://datasets/vlmdata-test/none", "-o", str(tmp_path / "o"),
                env={**env, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "HF_HUB_OFFLINE" in r.stderr, r.stderr


def test_hf_paths_without_huggingface_hub_are_one_line(tmp_path):
    code = ("import sys; sys.modules['huggingface_hub'] = None; from vlmdata.cli import main; "
            f"sys.exit(main(['shard', 'hf://datasets/a/b', '-o', {str(tmp_path / 'o')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: cannot read input hf://datasets/a/b: hf:// needs the huggingface_hub package: "
        "pip install huggingface_hub"), r.stderr


def test_cli_shards_a_save_to_disk_folder_like_its_jsonl(tmp_path):
    datasets = pytest.importorskip("datasets")
    corpus = generate_corpus(tmp_path / "corpus", 6, seed=10, fmt="llava")
    rows = read_jsonl(corpus / "data.jsonl")
    ds = datasets.Dataset.from_list(
        [{**r, "images": [{"bytes": (corpus / p).read_bytes(), "path": None} for p in r["images"]]} for r in rows],
        features=datasets.Features({
            "id": datasets.Value("string"), "images": datasets.List(datasets.Image()),
            "conversations": datasets.List({"from": datasets.Value("string"), "value": datasets.Value("string")})}))
    ds.save_to_disk(str(tmp_path / "saved"))
    r = vlmdata("shard", str(tmp_path / "saved"), "-o", str(tmp_path / "out"), "--workers", "2",
                "--max-samples-per-shard", "4")
    assert r.returncode == 0, r.stderr
    assert any(line.startswith("sharded 6 rows -> 6 samples") for line in r.stdout.splitlines()), r.stdout
    assert vlmdata("shard", str(corpus / "data.jsonl"), "-o", str(tmp_path / "ref"), "--workers", "0").returncode == 0
    assert stored_members(tmp_path / "out") == stored_members(tmp_path / "ref")


def test_a_table_beside_a_tar_is_still_read(tmp_path):
    import tarfile

    corpus = generate_corpus(tmp_path / "corpus", 3, seed=14, fmt="caption")
    with tarfile.open(corpus / "images-backup.tar", "w") as tar:
        tar.add(corpus / "images", arcname="images")
    m = shard(corpus, tmp_path / "out")
    assert m.num_samples == 3 and m.stats["input_formats"] == ["jsonl"]
