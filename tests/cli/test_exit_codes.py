"""Exit codes scripts can test: `vlmdata shard` / `index` / `retokenize` exit 3 (after writing everything they
could) when more than --max-skip-fraction is skipped, the last line naming the top reasons with an example each;
0 with a warning line from 1 % skipped; --max-skip-fraction 1.0 turns the check off."""
from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import tarfile

import pytest

from tests.helpers.corpus import generate_corpus
from tests.helpers.shards import jpeg
from vlmdata import ShardConfig, VLMDataset, shard_dataset
from vlmdata.cli import main
from vlmdata.formats import Manifest
from vlmdata.testing import chatml_folder

EXIT_TOO_MANY_SKIPS = 3


@pytest.fixture(scope="module")
def corpus21(tmp_path_factory):
    """21 LLaVA rows (seed 1): 20 with images, one without."""
    return generate_corpus(tmp_path_factory.mktemp("c21"), samples=21, seed=1)


def _no_image_ids(corpus) -> list[str]:
    rows = [json.loads(line) for line in (corpus / "data.jsonl").read_text().splitlines()]
    return [r["id"] for r in rows if not r["images"]]


def _shard(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vlmdata", "shard", *args], capture_output=True, text=True)


def test_wrong_image_root_exits_3_names_the_reason_and_writes_the_good_rows(corpus21, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    out = tmp_path / "out"
    r = _shard(str(corpus21 / "data.jsonl"), "-o", str(out), "--image-root", str(tmp_path / "elsewhere"),
               "--workers", "0")
    assert r.returncode == EXIT_TOO_MANY_SKIPS, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 20 of 21 input rows skipped (95.2 %): missing_file=20 (e.g. ")
    m = Manifest.load(str(out))
    ex = m.stats["examples"]["missing_file"]
    assert repr(ex["id"]) in last and str(tmp_path / "elsewhere") in last and "--max-skip-fraction 0.5" in last
    assert "sharded 21 rows -> 1 samples" in r.stdout
    # the good row is written and loads
    keys = [k for b in VLMDataset(str(out), decoder="pillow") for k in b["sample_keys"]]
    assert keys == _no_image_ids(corpus21) and m.num_samples == 1

    r = _shard(str(corpus21 / "data.jsonl"), "-o", str(tmp_path / "off"), "--image-root",
               str(tmp_path / "elsewhere"), "--workers", "0", "--max-skip-fraction", "1.0")
    assert r.returncode == 0, r.stderr
    assert "WARNING" in r.stderr and "20 of 21 input rows skipped" in r.stderr


def test_below_the_limit_exits_0_with_a_warning_line_and_a_lower_limit_exits_3(corrupt_llava_corpus, tmp_path):
    r = _shard(str(corrupt_llava_corpus / "data.jsonl"), "-o", str(tmp_path / "a"), "--workers", "0")
    assert r.returncode == 0, r.stderr
    st = Manifest.load(str(tmp_path / "a")).stats
    assert 0.01 <= st["skipped_total"] / st["input_rows"] <= 0.5
    warnings = [line for line in r.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and f"{st['skipped_total']} of 150 input rows skipped" in warnings[0]
    top = sorted(st["skipped"].items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    assert f"{top}={st['skipped'][top]} (e.g. {st['examples'][top]['id']!r}" in warnings[0]

    r = _shard(str(corrupt_llava_corpus / "data.jsonl"), "-o", str(tmp_path / "b"), "--workers", "0",
               "--max-skip-fraction", "0.05")
    assert r.returncode == EXIT_TOO_MANY_SKIPS
    assert "more than --max-skip-fraction 0.05" in r.stderr.strip().splitlines()[-1]
    assert Manifest.load(str(tmp_path / "b")).num_samples == st["samples"]


def test_a_clean_run_has_no_warning(tmp_path, caplog):
    corpus = generate_corpus(tmp_path / "clean", samples=12, seed=4)
    with caplog.at_level(logging.WARNING, logger="vlmdata"):
        assert main(["shard", str(corpus / "data.jsonl"), "-o", str(tmp_path / "o"), "--workers", "0"]) == 0
    assert not [r for r in caplog.records if "skipped" in r.getMessage()]


def test_max_skip_fraction_out_of_range_is_a_usage_error(corpus21, tmp_path):
    r = _shard(str(corpus21 / "data.jsonl"), "-o", str(tmp_path / "o"), "--max-skip-fraction", "1.5")
    assert r.returncode == 2 and "--max-skip-fraction must be between 0 and 1" in r.stderr
    assert not (tmp_path / "o").exists()


def _foreign_tars(root, bad: int, good: int) -> None:
    """One WebDataset tar: `bad` samples whose .jpg is not an image, then `good` good ones."""
    root.mkdir()
    with tarfile.open(root / "part-000.tar", "w") as tf:
        for i in range(bad + good):
            image = b"<html>not an image</html>" if i < bad else jpeg()
            for ext, data in (("jpg", image), ("txt", f"caption {i}".encode())):
                info = tarfile.TarInfo(f"k{i:04d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def test_index_honours_max_skip_fraction(tmp_path, capsys):
    _foreign_tars(tmp_path / "tars", bad=6, good=4)
    assert main(["index", str(tmp_path / "tars"), "--workers", "0"]) == EXIT_TOO_MANY_SKIPS
    captured = capsys.readouterr()
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("error: 6 of 10 samples skipped (60.0 %): not_an_image=6 (e.g. 'k0000' in part-000.tar")
    assert "indexed 1 shards" in captured.out and Manifest.load(str(tmp_path / "tars")).num_samples == 4
    assert main(["index", str(tmp_path / "tars"), "--workers", "0", "--max-skip-fraction", "0.6"]) == 0


def test_retokenize_honours_max_skip_fraction(corpus21, tmp_path, capsys):
    """Six of ten rows carry the new model's image token in their text: the view cannot encode them."""
    rows = [json.loads(line) for line in (corpus21 / "data.jsonl").read_text().splitlines()][:10]
    for r in rows[:6]:
        r["conversations"][1]["value"] += " <|image_pad|>"
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shard_dataset(ShardConfig(inputs=[str(tmp_path / "data.jsonl")], output=str(tmp_path / "d"), workers=0,
                              image_root=str(corpus21)))
    qwen = chatml_folder(tmp_path / "qwen")
    args = ["retokenize", str(tmp_path / "d"), "--tokenizer", str(qwen), "--workers", "0"]
    assert main(args) == EXIT_TOO_MANY_SKIPS
    captured = capsys.readouterr()
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("error: 6 of 10 samples skipped (60.0 %): marker_mismatch=6 (e.g. ")
    assert "view qwen: 4 of 10 samples encoded" in captured.out
    view = Manifest.load(str(tmp_path / "d")).views["qwen"]
    assert view["samples"] == 4 and view["skipped"] == {"marker_mismatch": 6}   # the view is added
    assert main([*args, "--overwrite", "--max-skip-fraction", "1"]) == 0
