"""The daemon says what SSD budget the readers' windows need: at start (from the manifests of its datasets)
and as a metric, updated when readers' plans show more readers than configured."""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from prometheus_client import generate_latest

from tests.helpers.cache import FAST_RETRY
from tests.helpers.cache import daemon_client as _client
from tests.helpers.dataset import make_samples, write_dataset
from vlmdata.cache import ShardRef
from vlmdata.cache.daemon import CacheDaemon, DaemonOptions, ReaderWindows
from vlmdata.dashboard import parse_counters
from vlmdata.formats import Manifest


def test_budget_needed_is_reported_at_start_and_as_a_metric(tmp_path, caplog):
    root = tmp_path / "ds"
    write_dataset(str(root), make_samples(24, seed=2), shard_size=8)
    manifest = Manifest.load(str(root))
    largest = max(s.bytes for s in manifest.shards)
    sockdir = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp"))
    d = CacheDaemon(DaemonOptions(cache_dir=str(tmp_path / "ssd"), disk_bytes=largest, socket_path=str(sockdir / "s"),
                                  prefetch_bytes=0, retry=FAST_RETRY, allow=[str(root)],
                                  windows=ReaderWindows(window_shards=4, workers=2, local_ranks=3)))
    try:
        with caplog.at_level(logging.INFO):
            d.start()
        need = 4 * 2 * 3 * largest
        assert d.budget_needed == need
        assert f"= {need} bytes" in caplog.text and "raise --disk-bytes to at least" in caplog.text
        exported = parse_counters(generate_latest(d.metrics.registry).decode())
        assert exported[("vlmdata_cache_budget_needed_bytes", ())] == need
        assert exported[("vlmdata_cache_budget_bytes", (("tier", "disk"),))] == largest
        # more readers than configured show up with their plans: the figure grows with them
        refs = [ShardRef(url=str(root / s.name), size=s.bytes, crc32=s.crc32) for s in manifest.shards]
        clients = [_client(d.opts.socket_path) for _ in range(7)]
        for c in clients:
            c.plan_ahead(refs)
        assert d.budget_needed == 4 * 7 * largest
        for c in clients:
            c.close()
    finally:
        d.stop()
        os.rmdir(sockdir)
