"""The loader says what its over-length policy did: one warning per epoch and per worker with the samples it
truncated (longer than max_tokens, cut at the text tail) and dropped (image tokens alone reach max_tokens;
more than max_images), counts equal to the packs' `stats` and to the Prometheus metrics."""
from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.paths import REPO
from vlmdata import ShardConfig, VLMDataset, shard_dataset
from vlmdata.loading import DatasetOptions

LOGGER = "vlmdata.loading.overlong"
# 336 px images are 576 tokens: samples with 2+ images are dropped, 1-image ones with 25+ text tokens truncated
SETTINGS = {"max_tokens": 600, "max_images": 4}
HEAD = re.compile(r"epoch (\d+), rank 0 of 1, worker (\d+) of (\d+): of (\d+) samples, (\d+) truncated to "
                  r"max_tokens=600 \(cut at the text tail\)")
OVERLONG = re.compile(r"(\d+) dropped as overlong \(their image tokens alone reach max_tokens\)")
TOO_MANY = re.compile(r"(\d+) dropped as too_many_images \(over the pack.s image budget, max_images=4\)")


def parse(line: str) -> tuple[int, ...] | None:
    """(epoch, worker, workers, samples, truncated, dropped overlong, dropped too_many_images) of a log line
    (a reason with no drops is left out of it)."""
    head = HEAD.search(line)
    if head is None:
        return None
    drops = [int(m.group(1)) if m else 0 for m in (OVERLONG.search(line), TOO_MANY.search(line))]
    return (*map(int, head.groups()), *drops)


@pytest.fixture(scope="module")
def dataset(small_llava_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("overlong") / "d"
    shard_dataset(ShardConfig(inputs=[str(small_llava_corpus / "data.jsonl")], output=str(out), workers=0,
                              max_samples_per_shard=30))
    return out


def _counts(batches) -> tuple[int, int, int, int]:
    """(samples delivered, truncated, dropped overlong, dropped too_many_images) over packs' stats."""
    sums = [0, 0, 0, 0]
    for b in batches:
        st = b["stats"]
        for i, v in enumerate((st["samples"], st["truncated"], st["skipped"].get("overlong", 0),
                               st["skipped"].get("too_many_images", 0))):
            sums[i] += v
    return tuple(sums)


def test_one_line_per_epoch_with_the_counts_of_the_packs(dataset, caplog):
    ds = VLMDataset(str(dataset), **SETTINGS, options=DatasetOptions(window_shards=2, defer_decode=True))
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            samples, truncated, overlong, many = _counts(ds)
        lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert len(lines) == 1, lines
        assert parse(lines[0]) == (epoch, 0, 1, samples + overlong + many, truncated, overlong, many), lines[0]
        assert truncated > 0 and overlong > 0 and many > 0
        assert samples + overlong + many == 120


def test_nothing_is_logged_when_every_sample_fits(dataset, caplog):
    ds = VLMDataset(str(dataset), max_tokens=1 << 16, max_images=16, options=DatasetOptions(defer_decode=True))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _counts(ds)[1:] == (0, 0, 0)
    assert not [r for r in caplog.records if r.name == LOGGER]


SCRIPT = textwrap.dedent("""
    import json, logging, sys
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from vlmdata.loading import DatasetOptions, VLMDataset, make_loader
    from vlmdata.metrics import MetricSet, instrument
    ds = VLMDataset(sys.argv[1], max_tokens=600, max_images=4,
                    options=DatasetOptions(window_shards=1, defer_decode=True))
    metrics, per_epoch = MetricSet(), []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        sums = [0, 0, 0]
        for b in instrument(make_loader(ds, num_workers=2, pin_memory=False), metrics):
            st = b["stats"]
            sums = [sums[0] + st["truncated"], sums[1] + st["skipped"].get("overlong", 0),
                    sums[2] + st["skipped"].get("too_many_images", 0)]
        per_epoch.append(sums)
    value = metrics.registry.get_sample_value
    print(json.dumps({"per_epoch": per_epoch,
                      "metrics": [value("vlmdata_truncated_samples_total", {"rank": "0"}),
                                  value("vlmdata_skipped_samples_total", {"rank": "0", "reason": "overlong"}),
                                  value("vlmdata_skipped_samples_total", {"rank": "0", "reason": "too_many_images"})]}))
""")


def test_each_worker_logs_once_per_epoch_and_the_metrics_agree(dataset):
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(dataset)], capture_output=True, text=True, cwd=REPO,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    found = [f for f in map(parse, r.stderr.splitlines()) if f]
    assert sorted((e, w) for e, w, *_ in found) == [(0, 0), (0, 1), (1, 0), (1, 1)], r.stderr
    for epoch in (0, 1):
        lines = [f for f in found if f[0] == epoch]
        assert [sum(f[i] for f in lines) for i in (4, 5, 6)] == result["per_epoch"][epoch]
    totals = [sum(e[i] for e in result["per_epoch"]) for i in range(3)]
    assert all(totals) and result["metrics"] == totals


def test_tuning_passes_do_not_log(dataset, caplog):
    """The tuner's LoopedDataset measures passes over copies of the dataset: they are not training epochs."""
    import itertools

    from vlmdata.tune import LoopedDataset

    ds = VLMDataset(str(dataset), **SETTINGS, options=DatasetOptions(defer_decode=True))
    n = sum(1 for _ in ds)                 # an epoch of the dataset itself logs its line
    assert [r for r in caplog.records if r.name == LOGGER]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = sum(b["stats"]["truncated"] for b in itertools.islice(LoopedDataset(ds), 2 * n + 1))
    assert got > 0 and not [r for r in caplog.records if r.name == LOGGER]
    assert ds.log_lengths
