"""`make_loader(ds, num_workers="auto")` on the real pipeline, using the tune cache; fingerprints of real datasets.

(`vlmdata tune` on the same kind of dataset: tests/cli/test_tune.py.)"""
from __future__ import annotations

import json
import multiprocessing as mp
import os

import pytest

from tests.helpers.tune import make_small_dataset
from vlmdata.loading import VLMDataset, make_loader
from vlmdata.testing import SyntheticDataset, SyntheticSpec
from vlmdata.tune import (
    LoaderRunner,
    LoaderSettings,
    MeasurePlan,
    TuneConfig,
    auto_loader_settings,
    dataset_fingerprint,
)

FAST = TuneConfig(measure_s=0.3, min_batches=4)


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    return make_small_dataset(str(tmp_path_factory.mktemp("tune-ds")), samples=80)


@pytest.fixture
def measure_spy(monkeypatch):
    """Counts LoaderRunner.measure calls (the real method still runs)."""
    calls = []
    real = LoaderRunner.measure

    def spy(self, settings, plan):
        calls.append(settings)
        return real(self, settings, plan)

    monkeypatch.setattr(LoaderRunner, "measure", spy)
    return calls


def test_make_loader_auto_uses_cache_synthetic(tmp_path, monkeypatch, measure_spy):
    monkeypatch.setenv("VLMDATA_CACHE_DIR", str(tmp_path))
    counter = mp.get_context("fork").Value("l", 0)
    ds = SyntheticDataset(SyntheticSpec(item_s=0.01, knee=2, contention=2.0), counter=counter)
    chosen = auto_loader_settings(ds, config=FAST)                 # tunes and caches (default budget)
    assert len(measure_spy) >= 3 and os.path.exists(tmp_path / "tune.json")
    n_runs, made = len(measure_spy), counter.value
    loader = make_loader(ds, num_workers="auto")
    assert len(measure_spy) == n_runs and counter.value == made     # nothing was measured again
    assert loader.num_workers == chosen.num_workers == 2
    assert loader.prefetch_factor == chosen.prefetch_factor
    it = iter(loader)
    assert next(it)["stats"]["images"] == 4
    del it


def test_make_loader_auto_real_dataset(dataset_dir, tmp_path, monkeypatch, measure_spy):
    monkeypatch.setenv("VLMDATA_CACHE_DIR", str(tmp_path))
    ds = VLMDataset(dataset_dir, max_tokens=2048, image_size=112, decoder="pillow", rank=0, world_size=1)
    chosen = auto_loader_settings(ds, config=FAST)
    assert measure_spy and 0 <= chosen.num_workers <= 3
    n_runs = len(measure_spy)
    cache_before = (tmp_path / "tune.json").read_text()
    loader = make_loader(ds, num_workers="auto")
    assert len(measure_spy) == n_runs and (tmp_path / "tune.json").read_text() == cache_before
    assert loader.num_workers == chosen.num_workers
    batch = next(iter(loader))
    assert batch["input_ids"].numel() > 0 and batch["stats"]["images"] >= 0


def test_real_fingerprint_follows_pipeline_settings(dataset_dir):
    a = VLMDataset(dataset_dir, max_tokens=2048, image_size=112, rank=0, world_size=1)
    b = VLMDataset(dataset_dir, max_tokens=4096, image_size=112, rank=0, world_size=1)
    c = VLMDataset(dataset_dir, max_tokens=2048, image_size=224, rank=0, world_size=1)
    d = VLMDataset(dataset_dir, max_tokens=2048, image_size=112, decoder="dali", rank=0, world_size=1)
    fps = [json.dumps(dataset_fingerprint(x), sort_keys=True) for x in (a, b, c, d)]
    assert len(set(fps)) == 4
    assert dataset_fingerprint(a)["sources"][0]["manifest_sha256"]
    again = VLMDataset(dataset_dir, max_tokens=2048, image_size=112, rank=0, world_size=1)
    assert json.dumps(dataset_fingerprint(again), sort_keys=True) == fps[0]


def test_measuring_with_zero_workers_restores_the_callers_decode_threads(dataset_dir):
    """A 0-worker measurement sets the dataset's decode threads to the candidate's, then must put back
    the caller's own setting (it used to restore 1, because VLMDataset's setting was not readable)."""
    ds = VLMDataset(dataset_dir, max_tokens=2048, image_size=112, decoder="pillow", rank=0, world_size=1)
    ds.set_decode_threads(3)
    runner = LoaderRunner(ds)
    assert runner.tunes_threads
    m = runner.measure(LoaderSettings(num_workers=0, decode_threads=2),
                       MeasurePlan(warmup_batches=0, measure_s=0.05, min_batches=2))
    assert m.error is None and m.batches >= 2
    assert ds.decode_threads == 3


def test_runner_loops_past_the_dataset_end_with_the_consumer_load(dataset_dir):
    ds = VLMDataset(dataset_dir, max_tokens=2048, image_size=112, decoder="pillow", rank=0, world_size=1)
    packs = sum(1 for _ in ds)
    m = LoaderRunner(ds).measure(LoaderSettings(num_workers=1, prefetch_factor=2),
                                 MeasurePlan(warmup_batches=0, measure_s=0.05, min_batches=2 * packs,
                                             consumer_cores=0.5))
    assert m.error is None and m.batches >= 2 * packs and m.note != "dataset ended"
    assert m.consumer_cores > 0.05
