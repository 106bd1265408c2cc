"""The tuner on a real DataLoader over a synthetic pipeline whose optimum is known."""
from __future__ import annotations

import multiprocessing as mp

import pytest

from vlmdata.testing import SyntheticDataset, SyntheticSpec
from vlmdata.tune import (
    LoaderRunner,
    LoaderSettings,
    MeasurePlan,
    TuneBudget,
    TuneConfig,
    auto_loader_settings,
    format_table,
    tune,
)

# Costs are sleeps, with >= 20 % between the optimum and its neighbours, so a loaded machine
# (the CI box is shared) does not move the optimum.
FAST = dict(measure_s=0.6, min_batches=6, consumer_cores=0)   # the known optimum is the loader's alone
BIG = TuneBudget(memory_bytes=1 << 40, time_s=120)


@pytest.mark.slow
def test_finds_known_peak_workers():
    spec = SyntheticSpec(item_s=0.04, knee=5, contention=2.0, payload_kb=1)
    runner = LoaderRunner(SyntheticDataset(spec))
    res = tune(runner=runner, budget=BIG, config=TuneConfig(cpu_count=8, **FAST))
    assert res.settings.num_workers == 5, format_table(res)
    space_size = 1 + 9 * 3 * 4      # what an exhaustive sweep of the 8-CPU space would run, at least
    assert runner.calls < 0.4 * space_size
    assert "w=5" in format_table(res).splitlines()[-2]


@pytest.mark.slow
def test_plateau_picks_the_knee():
    spec = SyntheticSpec(item_s=0.04, knee=2, contention=1.0, payload_kb=1)   # flat from 2 workers on
    res = tune(runner=LoaderRunner(SyntheticDataset(spec)), budget=BIG,
               config=TuneConfig(cpu_count=4, plateau_tol=0.25, **FAST))
    assert res.settings.num_workers == 2, format_table(res)          # 4 and 5 are no faster, only dearer


@pytest.mark.slow
def test_finds_decode_threads():
    spec = SyntheticSpec(item_s=0.004, image_s=0.01, images_per_item=4, knee=2, contention=2.0)
    res = tune(runner=LoaderRunner(SyntheticDataset(spec)), budget=BIG, config=TuneConfig(cpu_count=8, **FAST))
    assert (res.settings.num_workers, res.settings.decode_threads) == (2, 4), format_table(res)


@pytest.mark.slow
def test_honours_memory_budget():
    # more workers: faster; each holds 512 MiB, so a worker is far more memory than the run-to-run noise of
    # sampled PSS peaks (±200 MiB seen after a long suite, when a forked worker shares a large parent)
    spec = SyntheticSpec(item_s=0.02, knee=16, contention=1.0, alloc_mb=512)
    runner = LoaderRunner(SyntheticDataset(spec))
    plan = MeasurePlan(measure_s=0.2, min_batches=4)
    one, two = (runner.measure(LoaderSettings(w, 2), plan).memory_bytes for w in (1, 2))
    budget = two + (two - one) // 2          # 2 workers fit, 3 do not
    res = tune(runner=runner, budget=TuneBudget(memory_bytes=budget),
               config=TuneConfig(cpu_count=6, **FAST))
    table = format_table(res)
    chosen = [m for m in res.measurements if m.settings == res.settings and m.error is None]
    assert chosen and all(m.memory_bytes <= budget for m in chosen), table
    assert res.settings.num_workers == 2, table
    bigger = [m for m in res.measurements if m.settings.num_workers > 2]
    assert bigger and all(m.error or m.memory_bytes > budget for m in bigger), table
    assert "memory budget" in res.reason


def test_auto_uses_cached_choice_without_measuring(tmp_path):
    counter = mp.get_context("fork").Value("l", 0)
    ds = SyntheticDataset(SyntheticSpec(item_s=0.01, knee=2, contention=2.0), counter=counter)
    cfg = TuneConfig(cpu_count=2, **FAST)
    cache = str(tmp_path / "tune.json")
    first = LoaderRunner(ds)
    s1 = auto_loader_settings(ds, BIG, config=cfg, cache_path=cache, runner=first)
    assert first.calls >= 4 and counter.value > 0
    made = counter.value
    second = LoaderRunner(ds)
    s2 = auto_loader_settings(ds, BIG, config=cfg, cache_path=cache, runner=second)
    assert s2 == s1 and second.calls == 0 and counter.value == made
    assert s1.num_workers == 2
