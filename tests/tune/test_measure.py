"""LoaderRunner.measure on a real DataLoader over a synthetic pipeline: counts items and worker memory."""
from __future__ import annotations

from vlmdata.testing import SyntheticDataset, SyntheticSpec
from vlmdata.tune import LoaderRunner, LoaderSettings, MeasurePlan


def test_measure_counts_items_and_worker_memory():
    spec = SyntheticSpec(item_s=0.005, alloc_mb=40, images_per_item=3, tokens_per_item=100)
    runner = LoaderRunner(SyntheticDataset(spec))
    m = runner.measure(LoaderSettings(2, 2), MeasurePlan(measure_s=0.3, min_batches=6))
    assert m.error is None and m.batches >= 6
    assert m.images == 3 * m.batches and m.tokens == 100 * m.batches
    assert len(m.worker_pss) == 2 and all(p >= 40 << 20 for p in m.worker_pss)
    assert m.memory_bytes >= 80 << 20
    assert runner.calls == 1
