"""Overlong samples are visible before training: the shard summary and manifest count the samples longer than
common budgets and name the longest; `vlmdata inspect --max-tokens N` says how many exceed N. Every count equals
one computed here from the stored planning columns (text tokens + 576 tokens per image at 336 px, patch 14)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from vlmdata import ShardConfig, shard_dataset
from vlmdata.cli import main
from vlmdata.formats import SampleIndex
from vlmdata.ingest import BUDGETS

TOKENS_PER_IMAGE_336 = (336 // 14) ** 2


@pytest.fixture(scope="module")
def dataset(corrupt_llava_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("lengths") / "d"
    shard_dataset(ShardConfig(inputs=[str(corrupt_llava_corpus / "data.jsonl")], output=str(out), workers=0,
                              max_samples_per_shard=50))
    return out


def _stored_lengths(root, image_tokens: int = TOKENS_PER_IMAGE_336) -> np.ndarray:
    cols = np.load(root / "planning.npz")
    return cols["text_tokens"].astype(np.int64) + image_tokens * cols["n_images"].astype(np.int64)


def test_inspect_counts_the_samples_longer_than_max_tokens(dataset, capsys):
    lengths = _stored_lengths(dataset)
    budget = int(np.percentile(lengths, 80))
    assert main(["inspect", str(dataset), "--max-tokens", str(budget), "--samples", "0"]) == 0
    out = capsys.readouterr().out
    over = int((lengths > budget).sum())
    assert 0 < over < len(lengths)
    share = f"{100 * over / len(lengths):.1f} %"
    assert f"max_tokens={budget}: {over} of {len(lengths)} samples ({share}) are longer" in out
    for b in BUDGETS:
        assert re.search(rf"longer than +{b} tok +{int((lengths > b).sum())} ", out), b


def test_inspect_counts_with_another_image_size(dataset, capsys):
    lengths = _stored_lengths(dataset, image_tokens=(28 // 14) ** 2)
    budget = int(np.median(lengths))
    assert main(["inspect", str(dataset), "--max-tokens", str(budget), "--image-size", "28", "--samples", "0"]) == 0
    assert f"max_tokens={budget}: {int((lengths > budget).sum())} of {len(lengths)} samples" in capsys.readouterr().out


def test_the_manifest_and_shard_summary_report_budgets_and_the_longest_samples(dataset, corrupt_llava_corpus,
                                                                              tmp_path, capsys):
    from vlmdata.formats import Manifest

    m = Manifest.load(str(dataset))
    lengths = _stored_lengths(dataset)
    got = m.stats["lengths"]
    assert got["over"] == {str(b): int((lengths > b).sum()) for b in BUDGETS}
    order = np.argsort(-lengths, kind="stable")[:3]
    keys = [k for s in m.shards for k in SampleIndex.load(str(dataset / s.index)).keys()]
    assert [(x["key"], x["tokens"]) for x in got["longest"]] == [(keys[i], int(lengths[i])) for i in order]
    assert main(["shard", str(corrupt_llava_corpus / "data.jsonl"), "-o", str(tmp_path / "o"), "--workers", "0",
                 "--max-samples-per-shard", "50"]) == 0
    out = capsys.readouterr().out
    assert f"lengths: longest sample {int(lengths[order[0]])} tokens ({keys[order[0]]}); longer than 2048: " \
           f"{int((lengths > 2048).sum())} (" in out


def test_inspect_predicts_what_an_epoch_of_the_loader_truncates_and_drops(dataset, capsys):
    from vlmdata import VLMDataset
    from vlmdata.loading import DatasetOptions

    budget = int(np.percentile(_stored_lengths(dataset), 70))
    assert main(["inspect", str(dataset), "--max-tokens", str(budget), "--samples", "0"]) == 0
    said = re.search(r"cuts (\d+) at the text tail and drops (\d+) whose", capsys.readouterr().out)
    truncated = dropped = 0
    for b in VLMDataset(str(dataset), max_tokens=budget, max_images=64, options=DatasetOptions(defer_decode=True)):
        truncated += b["stats"]["truncated"]
        dropped += b["stats"]["skipped"].get("overlong", 0)
    assert said and (int(said.group(1)), int(said.group(2))) == (truncated, dropped) and truncated > 0
