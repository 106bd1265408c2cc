"""The dashboard in a real headless Chromium, fed by a running pipeline.

Shards live in a real S3 API (moto's server). A VLMDataset loader (2 workers, reading through the
cache daemon, whose SSD tier is smaller than the dataset so the object store keeps serving) runs
in a thread, instrumented into a rank MetricSet served over HTTP; the daemon serves its own metrics. `vlmdata dashboard` scrapes both;
Chromium loads the page, and the DOM must show every chart with data from that pipeline. A
screenshot is saved to artifacts/dashboard.png (repo root, git-ignored).
"""
from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers.browser import chromium, parse_dom, run_chromium
from tests.helpers.metrics import build_sharded_corpus
from tests.helpers.paths import REPO
from tests.helpers.s3 import moto_s3, upload_dir
from vlmdata.dashboard import CHARTS, Dashboard, DashboardConfig
from vlmdata.metrics import MetricSet, MetricsServer, instrument

ARTIFACTS = REPO / "artifacts"
LINE_COLOR = (0x4D, 0xAB, 0xF7)  # the first series colour in app.js


class Pipeline:
    """A loader looping over epochs in a thread until stopped, like a training loop would."""

    def __init__(self, loader, dataset, metrics: MetricSet):
        self.loader, self.dataset, self.metrics = loader, dataset, metrics
        self.stop = threading.Event()
        self.batches = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            epoch = 0
            while not self.stop.is_set():
                self.dataset.set_epoch(epoch)
                for batch in instrument(self.loader, self.metrics, rank=0):
                    batch["input_ids"].sum()  # the "training step"
                    self.batches += 1
                    if self.stop.is_set():
                        break
                epoch += 1
        except BaseException as exc:  # surfaced by the test
            self.error = exc


def wait_for(predicate, what, timeout: float = 120.0, pipeline: Pipeline | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pipeline is not None and pipeline.error is not None:
            raise AssertionError(f"pipeline failed: {pipeline.error!r}") from pipeline.error
        got = predicate()
        if got:
            return got
        time.sleep(0.2)  # polling a condition, with a deadline
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what() if callable(what) else what}")


def chart_series(data: dict, chart_id: str) -> dict:
    return next(c for c in data["charts"] if c["id"] == chart_id)["series"]


def has_values(data: dict, chart_id: str, n: int, nonzero: bool = True) -> bool:
    """Some line of the chart has `n` points (non-zero ones, unless `nonzero` is off: ratios may be 0)."""
    series = chart_series(data, chart_id)
    return any(sum(1 for _, v in pts if v is not None and (v or not nonzero)) >= n for pts in series.values())


@pytest.mark.slow
@pytest.mark.integration  # Chromium, moto's S3 server, the cache daemon
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_dashboard_shows_live_pipeline_in_chromium(tmp_path):
    from vlmdata.cache import CacheConfig
    from vlmdata.cache.daemon import CacheDaemon, DaemonOptions
    from vlmdata.loading import DatasetOptions, VLMDataset, make_loader

    corpus = build_sharded_corpus(tmp_path, samples=60, per_shard=10)
    with moto_s3() as s3:
        url = upload_dir(corpus.root, "vlmdata-test", "ds", s3)
        daemon_metrics = MetricSet(rank_labels=False)
        sock = str(tmp_path / "cache.sock")
        daemon = CacheDaemon(DaemonOptions(cache_dir=str(tmp_path / "cache"), disk_bytes=6 << 20, socket_path=sock,
                                           prefetch_bytes=4 << 20, storage_options=s3), metrics=daemon_metrics)
        daemon.start()
        try:
            ds = VLMDataset(url, seed=0, max_tokens=4096, image_size=56, rank=0, world_size=1, decoder="pillow",
                            cache=CacheConfig(daemon=sock, storage_options=s3),
                            options=DatasetOptions(storage_options=s3, window_shards=2))
            run_pipeline_and_browser(ds, make_loader(ds, num_workers=2), daemon_metrics, tmp_path)
        finally:
            daemon.stop()


def run_pipeline_and_browser(ds, loader, daemon_metrics: MetricSet, tmp_path: Path) -> None:
    rank_metrics = MetricSet()
    pipeline = Pipeline(loader, ds, rank_metrics)
    servers = [MetricsServer(rank_metrics), MetricsServer(daemon_metrics)]
    dash = Dashboard(DashboardConfig(targets=[s.url for s in servers], port=0, interval=0.5))
    try:
        pipeline.thread.start()

        def ready():
            data = json.loads(urllib.request.urlopen(dash.url + "api/data", timeout=10).read())
            ok = all(has_values(data, c, 3) for c in ("images_per_second", "tokens_per_second", "object_store_bytes"))
            ok = ok and all(has_values(data, c, 3, nonzero=False)
                            for c in ("padding_fraction", "data_wait_fraction", "cache_hit_rate"))
            return data if ok else None

        def missing():
            data = dash.data()
            counts = {c["id"]: {k: sum(1 for _, v in pts if v) for k, pts in c["series"].items()}
                      for c in data["charts"]}
            return (f"data for every chart; non-zero points per line: {counts}; targets {data['targets']}; "
                    f"{pipeline.batches} batches consumed")

        wait_for(ready, missing, pipeline=pipeline)

        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "dashboard.png"
        shot.unlink(missing_ok=True)
        run_chromium(dash.url, tmp_path / "profile-shot", "--virtual-time-budget=4000", "--window-size=1400,1000",
                     f"--screenshot={shot}")
        print(f"dashboard screenshot: {shot}")
        pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int16)
        assert pixels.shape == (1000, 1400, 3)
        drawn = int((np.abs(pixels - np.asarray(LINE_COLOR)) < 24).all(axis=-1).sum())
        assert drawn > 500, f"only {drawn} pixels of chart lines in {shot}"

        html = run_chromium(dash.url, tmp_path / "profile-dom", "--virtual-time-budget=4000", "--dump-dom").stdout
        dom = parse_dom(html)
        assert int(dom.body["data-refreshes"]) >= 1 and dom.body["data-errors"] == "0", dom.body
        status = dom.by_id["status"]
        assert status["data-targets"] == "2" and status["data-targets-up"] == "2"
        assert set(dom.charts) == {c.id for c in CHARTS}
        for cid, el in dom.charts.items():
            assert int(el["data-points"]) >= 3, (cid, el)
            assert int(el["data-lines"]) >= 1, (cid, el)
        latest = {cid: json.loads(el["data-latest"]) for cid, el in dom.charts.items()}
        for cid in ("images_per_second", "tokens_per_second", "object_store_bytes"):
            assert float(dom.charts[cid]["data-max"]) > 0, (cid, dom.charts[cid])
        assert "images" in latest["images_per_second"]
        assert set(latest["tokens_per_second"]) == {"real", "padding"}
        assert "rank 0" in latest["data_wait_fraction"]
        assert {k.split()[-1] for k in latest["cache_hit_rate"]} <= {"memory", "disk", "remote"}
        for cid in ("padding_fraction", "data_wait_fraction", "cache_hit_rate"):
            for v in latest[cid].values():
                assert v is None or 0.0 <= v <= 1.0, (cid, latest[cid])

        assert pipeline.batches > 0
    finally:
        pipeline.stop.set()
        pipeline.thread.join(timeout=60)
        dash.close()
        for s in servers:
            s.close()
    assert pipeline.error is None, repr(pipeline.error)


def test_missing_chromium_is_a_clear_failure(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="chromium not found.*apt-get install -y chromium"):
        chromium()
