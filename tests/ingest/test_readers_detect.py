"""Input detection: a directory holding one table is that table; runs that would write nothing fail clearly."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.corpus import generate_corpus
from tests.helpers.shards import read_jsonl, shard, wds_samples
from vlmdata.errors import ConfigError, EmptyDatasetError
from vlmdata.ingest import INPUT_FORMAT_ALIASES, INPUT_FORMATS, resolve_input


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """A gen_raw output directory: data.jsonl, images/, corrupt.json (a JSON object, not a table)."""
    return generate_corpus(tmp_path_factory.mktemp("raw"), samples=40, seed=3)


def test_gen_raw_directory_is_read_as_its_jsonl(raw, tmp_path):
    assert resolve_input(str(raw)) == (str(raw / "data.jsonl"), "jsonl")
    m = shard(raw, tmp_path / "out")
    rows = read_jsonl(raw / "data.jsonl")
    assert m.stats["input_formats"] == ["jsonl"] and m.stats["inputs"] == [str(raw / "data.jsonl")]
    assert m.num_samples == len(rows) == 40 and m.stats["skipped_total"] == 0
    got = wds_samples(tmp_path / "out")
    first = rows[0]
    assert got[first["id"]]["0.jpg"] == (raw / first["images"][0]).read_bytes()


@pytest.mark.parametrize("name", ["llava", "caption", "table"])
def test_layout_aliases_read_the_table(raw, tmp_path, name):
    m = shard(raw, tmp_path / "out", input_format=name)
    assert m.num_samples == 40 and m.stats["input_formats"] == ["jsonl"]


def test_aliases_and_names_in_the_error_message(raw):
    assert resolve_input(str(raw / "data.jsonl"), "llava") == (str(raw / "data.jsonl"), "jsonl")
    assert resolve_input(str(raw), "ndjson")[1] == "jsonl"
    with pytest.raises(ConfigError) as err:
        resolve_input(str(raw), "xml")
    for name in (*INPUT_FORMATS, *INPUT_FORMAT_ALIASES):
        assert name in str(err.value)
    with pytest.raises(ConfigError, match="holds no csv file"):
        resolve_input(str(raw), "csv")


def test_several_tables_in_a_directory_is_a_clear_error(tmp_path):
    d = tmp_path / "two"
    d.mkdir()
    (d / "a.jsonl").write_text("{}\n")
    (d / "b.csv").write_text("image,caption\n")
    (d / "meta.json").write_text('{"not": "a table"}')
    with pytest.raises(ConfigError, match=r"several tables \(a.jsonl, b.csv\)"):
        resolve_input(str(d))


def test_folder_without_captions_writes_nothing_and_says_why(raw, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(EmptyDatasetError) as err:
        shard(raw, out, input_format="folder")
    msg = str(err.value)
    n_images = len(list((raw / "images").iterdir()))
    assert f"all {n_images} input rows were skipped (missing_text={n_images})" in msg
    assert f"({n_images} image files, 0 .txt files, tables data.jsonl)" in msg
    assert "--input-format (one of json, jsonl" in msg and "llava" in msg
    assert not (out / "manifest.json").exists() and not (out / "_jobs").exists()
    # the failed run left no state: the corrected command needs no --resume
    assert shard(raw, out).num_samples == 40


def test_zero_rows_is_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(EmptyDatasetError, match=r"found 0 input rows in .*empty.jsonl read as jsonl"):
        shard(tmp_path / "empty.jsonl", tmp_path / "out")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(EmptyDatasetError, match=r"read as an image folder \(0 image files"):
        shard(tmp_path / "nothing", tmp_path / "out2")


def test_all_rows_skipped_names_the_columns(tmp_path):
    (tmp_path / "d.jsonl").write_text(json.dumps({"id": "x", "picture": "a.jpg", "caption": "c"}) + "\n")
    with pytest.raises(EmptyDatasetError, match="missing_image_ref=1.*--image-column"):
        shard(tmp_path / "d.jsonl", tmp_path / "out")


def test_cli_exit_2_on_empty_run_and_accepts_llava(raw, tmp_path):
    cmd = [sys.executable, "-m", "vlmdata", "shard", str(raw), "--workers", "0"]
    r = subprocess.run([*cmd, "-o", str(tmp_path / "a"), "--input-format", "folder"], capture_output=True, text=True)
    assert r.returncode == 2 and "error: all " in r.stderr and "missing_text" in r.stderr
    r = subprocess.run([*cmd, "-o", str(tmp_path / "b"), "--input-format", "llava"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "-> 40 samples" in r.stdout


def test_single_json_file_content_decides(tmp_path):
    (tmp_path / "lines.json").write_text('{"id": 1}\n{"id": 2}\n')
    (tmp_path / "array.json").write_text('[{"id": 1}]')
    assert resolve_input(str(tmp_path / "lines.json"))[1] == "jsonl"
    assert resolve_input(str(tmp_path / "array.json"))[1] == "json"
    # in a directory only the array counts as a table (a top-level object is a side file)
    (tmp_path / "lines.json").unlink()
    assert resolve_input(str(tmp_path)) == (str(tmp_path / "array.json"), "json")
