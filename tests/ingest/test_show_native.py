"""Issue 20, item 5: `vlmdata show` decodes with the dataset's own tokenizer (the real Qwen2-VL one, byte-level
BPE): non-ASCII text comes out exactly as the chat template wrote it (Hugging Face's processor is the
reference), images are one marker each, trained spans are marked and equal the assistant replies, and
`--view` picks among a dataset's text views."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.helpers.models import QWEN_TEST_PIXELS, qwen_folder_or_skip, qwen_processor, write_reference_rows
from vlmdata import ShardConfig, shard_dataset
from vlmdata.cli import main
from vlmdata.ingest import RetokenizeConfig, retokenize_dataset, show_samples

IMAGE_MARKER = re.compile(r"<image \d+x\d+ ×\d+>")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """(Qwen-sharded dataset, byte-tokenizer dataset with a Qwen view "qwen", the Qwen folder, rows, expected)."""
    folder = qwen_folder_or_skip(**QWEN_TEST_PIXELS)
    tmp = tmp_path_factory.mktemp("show-native")
    rows, expected = write_reference_rows(tmp / "raw")
    qwen, plain = str(tmp / "qwen"), str(tmp / "bytes")
    shard_dataset(ShardConfig(inputs=[str(rows)], output=qwen, tokenizer=str(folder), workers=0,
                              max_samples_per_shard=4))
    shard_dataset(ShardConfig(inputs=[str(rows)], output=plain, workers=0, max_samples_per_shard=4))
    retokenize_dataset(RetokenizeConfig(dataset=plain, tokenizer=str(folder), view="qwen", workers=0))
    return qwen, plain, folder, expected


def _reference(folder, expected) -> list[tuple[str, list[str]]]:
    """(the chat template's text, the trained replies + end of turn) of each conversation, by transformers."""
    proc = qwen_processor(folder)
    out = []
    for messages, _ in expected:
        text = proc.apply_chat_template(messages, tokenize=False)
        replies = ["".join(c["text"] for c in m["content"]) + "<|im_end|>" for m in messages if m["role"] == "assistant"]
        out.append((text, replies))
    return out


def _printed_text(report: str) -> str:
    """The text block of a one-sample plain report, indentation removed."""
    lines = report.split("\n")
    a = next(i for i, line in enumerate(lines) if line.startswith("  text "))
    b = lines.index("  trained spans")
    assert all(line.startswith("    ") for line in lines[a + 1:b])
    return "\n".join(line[4:] for line in lines[a + 1:b])


def _as_template_text(printed: str) -> str:
    return IMAGE_MARKER.sub("<|image_pad|>", printed.replace("⟦", "").replace("⟧", ""))


def test_show_prints_the_conversation_text_and_trained_replies_exactly(datasets):
    qwen, _, folder, expected = datasets
    for n, (text, replies) in enumerate(_reference(folder, expected)):
        key = f"conv{n}"
        report, missing = show_samples(qwen, [key])
        assert missing == [] and "\ufffd" not in report
        printed = _printed_text(report)
        assert _as_template_text(printed) == text
        assert re.findall(r"⟦(.*?)⟧", printed, flags=re.S) == replies
        assert len(IMAGE_MARKER.findall(printed)) == len(expected[n][1])
        (r,) = json.loads(show_samples(qwen, [key], as_json=True)[0])["samples"]
        assert [s["text"] for s in r["trained_spans"]] == replies
        assert IMAGE_MARKER.sub("<|image_pad|>", r["text"]) == text
        assert r["view"] == folder.name and r["other_views"] == []


def test_non_ascii_conversation_in_the_report(datasets):
    qwen, _, folder, expected = datasets
    report, _ = show_samples(qwen, ["conv2"])
    assert "東京の写真ですか？ Привет, naïve café ☕ — مرحبا" in report
    assert "⟦はい、東京です。 Да! 😀<|im_end|>⟧" in report
    assert '"はい、東京です。 Да! 😀<|im_end|>"' in report          # the trained span listed, quoted
    tokens = json.loads(show_samples(qwen, ["conv2"], as_json=True)[0])["samples"][0]["pieces"]
    image = [p for p in tokens if p["kind"] == "image"]
    assert len(image) == 1 and image[0]["end"] - image[0]["start"] == 1


def test_view_option_decodes_each_view_with_its_own_tokenizer(datasets, capsys):
    _, plain, folder, expected = datasets
    text, replies = _reference(folder, expected)[2]
    assert main(["show", plain, "conv2", "--color", "never"]) == 0
    default = capsys.readouterr().out
    assert "view      default, tokenizer vlmdata-bytes-v1; other views: qwen (--view NAME)" in default
    assert "[assistant] ⟦はい、東京です。 Да! 😀<eos>⟧" in default and "\ufffd" not in default
    assert main(["show", plain, "conv2", "--view", "qwen", "--color", "never"]) == 0
    printed = _printed_text(capsys.readouterr().out)
    assert _as_template_text(printed) == text and re.findall(r"⟦(.*?)⟧", printed, flags=re.S) == replies
    assert main(["show", plain, "conv2", "--view", "nope"]) == 2
    assert "no text view 'nope'" in capsys.readouterr().err


def test_colour_on_request_and_a_moved_tokenizer_folder(datasets, tmp_path, capsys):
    qwen, _, folder, _ = datasets
    assert main(["show", qwen, "conv2", "--color", "always"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[32mはい、東京です。 Да! 😀<|im_end|>\x1b[0m" in out and "⟦" not in out
    assert "\x1b[36m<image 300x300 ×121>\x1b[0m" in out
    qwen = str(shutil.copytree(qwen, tmp_path / "copy"))
    manifest = json.loads(open(f"{qwen}/manifest.json").read())
    for identity in [manifest["tokenizer"]] + [v["tokenizer"] for v in manifest.get("views", {}).values()]:
        identity["path"] = str(tmp_path / "moved")
    with open(f"{qwen}/manifest.json", "w") as f:
        json.dump(manifest, f)
    assert main(["show", qwen, "conv2"]) == 2
    assert "pass the model folder with --tokenizer DIR" in capsys.readouterr().err
    assert main(["show", qwen, "conv2", "--tokenizer", str(folder), "--color", "never"]) == 0
    assert "⟦はい、東京です。 Да! 😀<|im_end|>⟧" in capsys.readouterr().out
    other = tmp_path / "other"
    other.mkdir()
    for p in folder.iterdir():
        (other / p.name).write_bytes(p.read_bytes())
    (other / "tokenizer_config.json").write_text((folder / "tokenizer_config.json").read_text().replace(
        '"model_max_length": 32768', '"model_max_length": 1024'))
    assert main(["show", qwen, "conv2", "--tokenizer", str(other)]) == 2
    assert "not those the dataset was tokenized with" in capsys.readouterr().err
