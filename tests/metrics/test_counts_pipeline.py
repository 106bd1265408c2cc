"""Metric counts through the real pipeline: VLMDataset + make_loader, 3 worker processes, 2 epochs.

Ground truth comes from the corpus (manifest counts, planning columns) and from the batches the
consumer actually received; the registry must match both exactly. Also: bad samples are counted
by reason, and no worker process ever writes a metrics file (nothing grows across epochs).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.metrics import IMAGE_SIZE, build_sharded_corpus, planned_real_tokens, run_epochs
from tests.helpers.paths import REPO
from vlmdata.decode import make_policy
from vlmdata.formats import Manifest, SampleIndex
from vlmdata.metrics import MetricSet

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_sharded_corpus(tmp_path_factory.mktemp("metrics_corpus"), samples=60, per_shard=10)


def sample_lengths(root: Path) -> np.ndarray:
    """Tokens of every sample (text + the policy's image tokens), from the index alone."""
    with np.load(root / "planning.npz", allow_pickle=False) as z:
        cols = {k: z[k] for k in z.files}
    per_image = make_policy(IMAGE_SIZE).tokens(cols["width"], cols["height"]).astype(np.int64)
    owner = np.repeat(np.arange(len(cols["n_images"])), cols["n_images"].astype(np.int64))
    return cols["text_tokens"].astype(np.int64) + np.bincount(owner, per_image, len(cols["n_images"])).astype(np.int64)


def value(ms: MetricSet, name: str, **labels) -> float:
    return ms.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.slow
def test_counts_exact_with_three_workers_over_two_epochs(corpus):
    ms = MetricSet()
    lengths = sample_lengths(corpus.root)
    real_per_epoch = planned_real_tokens(corpus, make_policy(IMAGE_SIZE))
    assert real_per_epoch == lengths.sum()
    seen = run_epochs(corpus.root, ms, max_tokens=int(lengths.max()))  # nothing truncated: every token counts
    # what the consumer received is the corpus, twice, each sample once per epoch
    assert seen["samples"] == 2 * corpus.samples and set(seen["keys"].values()) == {2}
    assert seen["images"] == 2 * corpus.images
    assert seen["real"] == 2 * real_per_epoch
    # and the registry agrees exactly, though every count was made in a worker process that has exited
    assert value(ms, "vlmdata_samples_total", rank="0") == 2 * corpus.samples
    assert value(ms, "vlmdata_images_total", rank="0") == 2 * corpus.images
    assert value(ms, "vlmdata_real_tokens_total", rank="0") == 2 * real_per_epoch
    assert value(ms, "vlmdata_padding_tokens_total", rank="0") == seen["padding"]
    assert value(ms, "vlmdata_packs_total", rank="0") == seen["batches"]
    assert value(ms, "vlmdata_steps_total", rank="0") == seen["batches"]
    assert value(ms, "vlmdata_decode_seconds_total", rank="0") > 0
    assert value(ms, "vlmdata_truncated_samples_total", rank="0") == 0
    skipped = [s for s in ms.registry.collect() if s.name == "vlmdata_skipped_samples"][0].samples
    assert sum(s.value for s in skipped if s.name.endswith("_total")) == 0
    wait = value(ms, "vlmdata_data_wait_seconds_total", rank="0")
    assert 0 < wait <= value(ms, "vlmdata_step_seconds_total", rank="0")


def corrupt_images(root: Path, picks: list[tuple[int, int]]) -> None:
    """Overwrite the first image of sample `i` of shard `s` with garbage; keep the manifest's CRC in step."""
    manifest = Manifest.load(str(root))
    for s, i in picks:
        info = manifest.shards[s]
        index = SampleIndex.load(str(root / info.index))
        j = int(index.image_start[i])
        assert index.n_images[i] >= 1
        path = root / info.name
        data = bytearray(path.read_bytes())
        off, size = int(index.img_offset[j]), int(index.img_size[j])
        data[off:off + size] = (b"not a jpeg " * (size // 11 + 1))[:size]
        path.write_bytes(bytes(data))
        info.crc32 = zlib.crc32(bytes(data)) & 0xFFFFFFFF
        index.describes(len(data), info.crc32).save(str(root / info.index))   # the index names the new bytes too
    manifest.save(str(root))


@pytest.mark.slow
def test_skipped_samples_counted_by_reason_exactly(tmp_path):
    corpus = build_sharded_corpus(tmp_path, samples=40, per_shard=10, seed=5)
    cols = np.load(corpus.root / "planning.npz")
    with_images = [(int(s), int(i)) for s, i, n in zip(cols["shard"], cols["local"], cols["n_images"]) if n > 0]
    picks = [with_images[0], with_images[len(with_images) // 2], with_images[-1]]
    corrupt_images(corpus.root, picks)
    lengths = sample_lengths(corpus.root)
    bad = {int(np.flatnonzero((cols["shard"] == s) & (cols["local"] == i))[0]) for s, i in picks}
    max_tokens = int(np.median(lengths))
    ms = MetricSet()
    seen = run_epochs(corpus.root, ms, max_tokens=max_tokens)
    skipped = {s.labels["reason"]: s.value for fam in ms.registry.collect()
               if fam.name == "vlmdata_skipped_samples" for s in fam.samples if s.name.endswith("_total")}
    assert sum(skipped.values()) == 2 * len(picks), skipped
    assert all(reason for reason in skipped)
    assert seen["samples"] == 2 * (corpus.samples - len(picks))
    assert value(ms, "vlmdata_samples_total", rank="0") == seen["samples"]
    assert value(ms, "vlmdata_images_total", rank="0") == seen["images"]
    overlong = sum(1 for j, n in enumerate(lengths) if n > max_tokens and j not in bad)
    assert overlong > 0
    assert value(ms, "vlmdata_truncated_samples_total", rank="0") == 2 * overlong
    assert value(ms, "vlmdata_real_tokens_total", rank="0") == seen["real"]


CHILD = r"""
import json, os, sys
from tests.helpers.metrics import run_epochs
from vlmdata.metrics import MetricSet
from pathlib import Path
ms = MetricSet()
seen = run_epochs(Path(sys.argv[1]), ms, max_tokens=4096)
print(json.dumps({"pid": os.getpid(), "samples": seen["samples"],
                  "metric": ms.registry.get_sample_value("vlmdata_samples_total", {"rank": "0"})}))
"""


@pytest.mark.slow
def test_no_per_process_metric_files(corpus, tmp_path):
    """With prometheus_client's multiprocess mode on, only the consumer ever writes a metrics file:
    workers carry plain counts in the packs, so nothing is created per worker or per epoch."""
    mp = tmp_path / "prom_mp"
    mp.mkdir()
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(mp), PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", CHILD, str(corpus.root)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["samples"] == got["metric"] == 2 * corpus.samples
    files = sorted(p.name for p in mp.iterdir())
    assert files, "multiprocess mode was not active in the child"
    assert all(name.endswith(f"_{got['pid']}.db") for name in files), files
