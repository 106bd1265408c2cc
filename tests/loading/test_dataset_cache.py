"""VLMDataset with a cache: DataLoader workers reading through the node daemon (and on after it is gone), and
with in-process tiers."""
from __future__ import annotations

import tempfile
from pathlib import Path

from tests.helpers.cache import FAST_RETRY
from tests.helpers.dataset import make_samples, write_dataset
from vlmdata.cache import CacheConfig
from vlmdata.cache.daemon import CacheDaemon, DaemonOptions
from vlmdata.formats import Manifest
from vlmdata.loading import DatasetOptions, VLMDataset, make_loader


def _epoch_keys(ds) -> list[str]:
    keys: list[str] = []
    for batch in make_loader(ds, num_workers=2, pin_memory=False):
        keys += batch["sample_keys"]
    return keys


def test_dataset_workers_through_daemon_and_after_it_is_gone(tmp_path):
    root = tmp_path / "ds"
    samples = make_samples(96, seed=3)
    write_dataset(str(root), samples, shard_size=12)
    manifest = Manifest.load(str(root))
    kw = dict(seed=0, max_tokens=2048, image_size=56, rank=0, world_size=1, decoder="pillow")
    direct = sorted(_epoch_keys(VLMDataset(str(root), **kw)))
    assert direct == sorted(s.key for s in samples)

    sockdir = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp"))
    sock = str(sockdir / "d.sock")
    daemon = CacheDaemon(DaemonOptions(cache_dir=str(tmp_path / "ssd"), disk_bytes=1 << 26, socket_path=sock,
                                       prefetch_bytes=1 << 24, retry=FAST_RETRY))
    daemon.start()
    try:
        cache = CacheConfig(memory_bytes=1 << 24, prefetch_bytes=1 << 24, daemon=sock, retry=FAST_RETRY)
        via_daemon = sorted(_epoch_keys(VLMDataset(str(root), cache=cache, **kw)))
        stats = daemon.cache.stats.to_dict()
    finally:
        daemon.stop()
    assert via_daemon == direct  # exactly once, nothing lost
    # both workers read every shard, but each shard left the store once for the node
    assert stats["remote_fetches"] == len(manifest.shards)
    assert stats["remote_bytes"] == manifest.total_bytes
    # the daemon is gone now: the same config falls back to direct fetching in each worker
    assert sorted(_epoch_keys(VLMDataset(str(root), cache=cache, **kw))) == direct
    sockdir.rmdir()


def test_dataset_workers_with_in_process_tiers(tmp_path):
    root = tmp_path / "ds"
    samples = make_samples(48, seed=4)
    write_dataset(str(root), samples, shard_size=12)
    cache = CacheConfig(memory_bytes=1 << 24, disk_dir=str(tmp_path / "ssd"), disk_bytes=1 << 26,
                        prefetch_bytes=1 << 24, retry=FAST_RETRY)
    kw = dict(seed=0, max_tokens=2048, image_size=56, rank=0, world_size=1, decoder="pillow", cache=cache)
    keys = sorted(_epoch_keys(VLMDataset(str(root), **kw)))
    assert keys == sorted(s.key for s in samples)
    # each worker owns its share of the SSD tier
    subdirs = sorted(p.name for p in (tmp_path / "ssd").iterdir())
    assert subdirs == ["r0-w0", "r0-w1"]
    assert all(any(p.suffix == ".data" for p in (tmp_path / "ssd" / d).iterdir()) for d in subdirs)


def test_daemon_budget_smaller_than_the_readers_windows_loses_no_sample(tmp_path):
    """The issue's set-up, scaled down: an SSD budget far below what two workers with 4-shard windows hold,
    prefetch on, two epochs. Pressure costs refetches and direct reads, never a sample."""
    root = tmp_path / "ds"
    samples = make_samples(96, seed=6)
    write_dataset(str(root), samples, shard_size=8)           # 12 shards
    manifest = Manifest.load(str(root))
    largest = max(s.bytes for s in manifest.shards)
    budget = int(2.5 * largest)
    sockdir = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp"))
    sock = str(sockdir / "d.sock")
    daemon = CacheDaemon(DaemonOptions(cache_dir=str(tmp_path / "ssd"), disk_bytes=budget, socket_path=sock,
                                       prefetch_bytes=1 << 24, prefetch_threads=4, retry=FAST_RETRY))
    daemon.start()
    try:
        cache = CacheConfig(memory_bytes=1 << 24, prefetch_bytes=1 << 22, daemon=sock, retry=FAST_RETRY)
        ds = VLMDataset(str(root), seed=0, max_tokens=1024, image_size=56, rank=0, world_size=1, decoder="pillow",
                        cache=cache, options=DatasetOptions(window_shards=4))
        for epoch in (0, 1):
            ds.set_epoch(epoch)
            keys, skipped = [], {}
            for batch in make_loader(ds, num_workers=2, pin_memory=False):
                keys += batch["sample_keys"]
                for reason, n in batch["stats"]["skipped"].items():
                    skipped[reason] = skipped.get(reason, 0) + n
            assert skipped == {} and sorted(keys) == sorted(s.key for s in samples)
        stats = daemon.cache.stats.to_dict()
        used = daemon.cache.disk.used
    finally:
        daemon.stop()
    sockdir.rmdir()
    assert stats["evictions"].get("disk", 0) > 0              # the budget really was under pressure
    assert used <= budget
