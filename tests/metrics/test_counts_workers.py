"""StatsDelta through real DataLoader worker processes: exact totals, nothing lost at worker exit.

The end-to-end version over VLMDataset is tests/metrics/test_counts_pipeline.py; this one isolates the
mechanism with a tiny IterableDataset whose per-pack stats are known in advance.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from vlmdata.metrics import MetricSet, StatsDelta, instrument

N_ITEMS = 37


def item_stats(i: int) -> StatsDelta:
    d = StatsDelta(samples=1 + i % 3, images=i % 4, real_tokens=100 + i, padded_tokens=i % 5, packs=1,
                   decode_seconds=0.001 * i)
    if i % 7 == 0:
        d.skipped["corrupt_image"] += 1
    d.record_fetch("memory" if i % 2 else "remote", hit=bool(i % 2), nbytes=1000 + i)
    return d


class ToyPacks(IterableDataset):
    """Yields one pack per item, round-robin over workers, each with its StatsDelta as a dict."""

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        for i in range(wid, N_ITEMS, nw):
            yield {"input_ids": torch.arange(4), "stats": item_stats(i).to_dict()}


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_counts_exact_with_three_workers_over_two_epochs():
    expected = StatsDelta()
    for _ in range(2):
        for i in range(N_ITEMS):
            expected.merge(item_stats(i))
    ms = MetricSet()
    loader = DataLoader(ToyPacks(), batch_size=None, num_workers=3, persistent_workers=False)
    seen = 0
    for _epoch in range(2):
        for _batch in instrument(loader, ms, rank=0):
            seen += 1
    assert seen == 2 * N_ITEMS

    def v(name, **labels):
        return ms.registry.get_sample_value(name, labels)

    assert v("vlmdata_samples_total", rank="0") == expected.samples
    assert v("vlmdata_images_total", rank="0") == expected.images
    assert v("vlmdata_real_tokens_total", rank="0") == expected.real_tokens
    assert v("vlmdata_padding_tokens_total", rank="0") == expected.padded_tokens
    assert v("vlmdata_packs_total", rank="0") == 2 * N_ITEMS
    assert abs(v("vlmdata_decode_seconds_total", rank="0") - expected.decode_seconds) < 1e-9
    assert v("vlmdata_skipped_samples_total", rank="0", reason="corrupt_image") == expected.skipped["corrupt_image"]
    assert v("vlmdata_cache_hits_total", tier="memory") == expected.cache_hits["memory"]
    assert v("vlmdata_cache_misses_total", tier="remote") == expected.cache_misses["remote"]
    assert v("vlmdata_fetch_bytes_total", tier="remote") == expected.fetch_bytes["remote"]
    assert v("vlmdata_steps_total", rank="0") == 2 * N_ITEMS
    assert expected.skipped == Counter({"corrupt_image": 2 * len(range(0, N_ITEMS, 7))})
