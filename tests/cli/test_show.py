"""`vlmdata show` and `vlmdata index --rebuild-keys` from the command line: output, exit codes, errors."""
import os

import pytest

from tests.helpers.dataset import make_samples, write_dataset
from vlmdata.cli import main

SAMPLES = make_samples(10, seed=1)


@pytest.fixture
def root(tmp_path):
    root = str(tmp_path / "ds")
    write_dataset(root, SAMPLES, shard_size=4)
    return root


def test_show_needs_a_key_index_then_finds_samples(root, tmp_path, capsys):
    n_images = len(SAMPLES[7].images)
    assert SAMPLES[7].key == "s00007" and n_images > 0
    assert main(["show", root, "s00001"]) == 2
    assert "vlmdata index --rebuild-keys" in capsys.readouterr().err
    assert main(["index", root, "--rebuild-keys"]) == 0
    assert "keys.lmdb: 10 keys" in capsys.readouterr().out
    assert main(["show", root, "s00007", "--images", str(tmp_path / "imgs")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sample s00007") and "shard 1 of 3" in out and "row 3" in out
    assert sorted(os.listdir(tmp_path / "imgs")) == [f"s00007.{j}.jpg" for j in range(n_images)]
    assert main(["show", root, "s00002", "missing-key"]) == 1
    out = capsys.readouterr().out
    assert "sample s00002" in out and "no sample with key 'missing-key'" in out


def test_rebuild_keys_of_a_directory_without_a_dataset_fails_clearly(tmp_path, capsys):
    assert main(["index", str(tmp_path), "--rebuild-keys"]) == 2
    assert "no manifest.json" in capsys.readouterr().err
