"""`vlmdata tune`: the table, then the cached answer; argument checks and sizes."""
from __future__ import annotations

import json

import pytest

from tests.helpers.tune import make_small_dataset
from vlmdata.cli import main as cli_main
from vlmdata.cli import parse_size

pytestmark = pytest.mark.usefixtures("frozen_heap")     # the tuner measures in process (see tests/conftest.py)


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    return make_small_dataset(str(tmp_path_factory.mktemp("tune-ds")), samples=80)


def test_cli_tune_prints_table_then_uses_cache(dataset_dir, tmp_path, capsys):
    args = ["tune", dataset_dir, "--max-tokens", "2048", "--image-size", "112", "--decoder", "pillow",
            "--measure-seconds", "0.3", "--cpus", "1", "--memory-budget", "4G", "--cache", str(tmp_path / "t.json")]
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert "images/s" in out and "tokens/s" in out and "choice: w=" in out and "reason:" in out
    assert "(from cache)" not in out
    assert cli_main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["from_cache"] is True and data["memory_budget"] == 4 << 30 and data["cpu_count"] == 1


def test_cli_rejects_bad_arguments(dataset_dir, capsys):
    assert cli_main(["tune", dataset_dir, "--max-tokens", "0"]) == 2
    assert "must be > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["tune", dataset_dir, "--memory-budget", "lots"])


def test_parse_size():
    assert parse_size("8G") == 8 << 30 and parse_size("512MiB") == 512 << 20 and parse_size("1000") == 1000
    assert parse_size("1.5g") == 3 << 29
    with pytest.raises(Exception, match="bad size"):
        parse_size("lots")


def test_cli_pixels_flag(dataset_dir, capsys):
    """--pixels exact needs a model family (issue 21): a byte-tokenizer dataset gets a one-line error."""
    assert cli_main(["tune", dataset_dir, "--image-size", "112", "--pixels", "exact"]) != 0
    assert "pixels='exact' is not possible: the dataset has no model family" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["tune", dataset_dir, "--pixels", "precise"])
