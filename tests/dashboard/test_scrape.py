"""Scraping metrics for the dashboard: target URLs, parsing, rates, ratios, resets, down targets."""
from __future__ import annotations

import json

import pytest
from prometheus_client import generate_latest

from vlmdata.dashboard import (
    CHARTS,
    RateTracker,
    chart_values,
    normalize_target,
    parse_counters,
)
from vlmdata.metrics import MetricSet, MetricsServer, StatsDelta

CHART = {c.id: c for c in CHARTS}


def exposition(ms: MetricSet) -> dict:
    return parse_counters(generate_latest(ms.registry).decode())


def test_normalize_target():
    assert normalize_target("localhost:9400") == "http://localhost:9400/metrics"
    assert normalize_target("http://h:1/") == "http://h:1/metrics"
    assert normalize_target("http://h:1/custom/path") == "http://h:1/custom/path"
    with pytest.raises(ValueError):
        normalize_target("  ")


def test_rates_ratios_and_grouping():
    ms = MetricSet()
    ms.absorb(StatsDelta(images=10, real_tokens=100, padded_tokens=0), rank=0)
    before = exposition(ms)
    ms.absorb(StatsDelta(images=20, real_tokens=900, padded_tokens=100), rank=0)
    ms.absorb(StatsDelta(images=4), rank=1)
    ms.observe_wait(1.0, 0), ms.observe_step(4.0, 0)
    ms.observe_wait(3.0, 1), ms.observe_step(4.0, 1)
    for _ in range(3):
        ms.record_fetch("memory", hit=True)
    ms.record_fetch("memory", hit=False)
    ms.record_fetch("remote", hit=False, nbytes=5000)
    after = exposition(ms)
    pair = [(before, after, 2.0)]
    assert chart_values(CHART["images_per_second"], pair) == {"images": pytest.approx(12.0)}
    assert chart_values(CHART["tokens_per_second"], pair) == {"real": pytest.approx(450.0), "padding": pytest.approx(50.0)}
    assert chart_values(CHART["padding_fraction"], pair) == {"padding": pytest.approx(0.1)}
    assert chart_values(CHART["data_wait_fraction"], pair) == {"rank 0": pytest.approx(0.25), "rank 1": pytest.approx(0.75)}
    assert chart_values(CHART["cache_hit_rate"], pair) == {"tier memory": pytest.approx(0.75), "tier remote": 0.0}
    assert chart_values(CHART["object_store_bytes"], pair) == {"remote": pytest.approx(2500.0)}
    # two targets add up; a restarted target (counter went down) counts from zero
    restarted = MetricSet()
    restarted.absorb(StatsDelta(images=6), rank=2)
    pairs = pair + [(after, exposition(restarted), 3.0)]
    assert chart_values(CHART["images_per_second"], pairs) == {"images": pytest.approx(12.0 + 2.0)}
    # no traffic at all: ratios are undefined (None), not 0
    assert chart_values(CHART["padding_fraction"], [(after, after, 1.0)]) == {"padding": None}


def test_tracker_survives_a_down_target_and_serves_json():
    ms = MetricSet()
    with MetricsServer(ms) as server:
        dead = MetricsServer(MetricSet())
        dead_url = dead.url
        dead.close()
        tracker = RateTracker([server.url, dead_url], timeout=2)
        assert tracker.scrape_once() == {}  # first scrape: nothing to difference yet
        ms.absorb(StatsDelta(images=8), rank=0)
        point = tracker.scrape_once()
        assert point["charts"]["images_per_second"]["images"] > 0
        snap = tracker.snapshot()
    status = {t["url"]: t for t in snap["targets"]}
    assert status[server.url]["up"] and status[server.url]["scrapes"] == 2
    assert not status[dead_url]["up"] and status[dead_url]["errors"] == 2
    assert "Connection" in status[dead_url]["last_error"] or "refused" in status[dead_url]["last_error"]
    images = next(c for c in snap["charts"] if c["id"] == "images_per_second")
    assert len(images["series"]["images"]) == 1
    json.dumps(snap, allow_nan=False)


def test_only_http_targets_are_scraped(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("vlmdata_samples_total 42\n")   # would even parse as an exposition
    for target in (f"file://{secret}", "ftp://127.0.0.1/metrics", f"simplecache::file://{secret}", "gopher://h:1/"):
        with pytest.raises(ValueError, match="http"):
            normalize_target(target)
        with pytest.raises(ValueError, match="http"):
            RateTracker([target])
    assert normalize_target("https://h:1") == "https://h:1/metrics"


def test_a_redirect_to_a_file_is_not_followed(tmp_path):
    import http.server
    import threading

    secret = tmp_path / "secret.txt"
    secret.write_text("vlmdata_samples_total 314159265\n")      # a value no port or path can contain

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(302)
            self.send_header("Location", f"file://{secret}")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tracker = RateTracker([f"127.0.0.1:{server.server_address[1]}"])
        tracker.scrape_once()
        status = tracker.snapshot()["targets"][0]
    finally:
        server.shutdown()
        server.server_close()
    assert not status["up"] and status["errors"] == 1 and "314159265" not in json.dumps(tracker.snapshot())


def test_a_trickling_target_times_out_alone_and_the_others_are_scraped():
    """A target sending one byte every 0.5 s forever: the scrape ends after its timeout, the other target is up."""
    import http.server
    import threading

    stop = threading.Event()

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            while not stop.is_set():
                self.wfile.write(b"#")
                self.wfile.flush()
                stop.wait(0.5)

        def log_message(self, *args):
            pass

    slow = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    slow.daemon_threads = True
    threading.Thread(target=slow.serve_forever, daemon=True).start()
    ms = MetricSet()
    try:
        with MetricsServer(ms) as server:
            slow_url = f"http://127.0.0.1:{slow.server_address[1]}/metrics"
            tracker = RateTracker([slow_url, server.url], timeout=1.5)
            done = threading.Event()

            def scrape_twice():
                tracker.scrape_once()
                ms.absorb(StatsDelta(images=8), rank=0)
                tracker.scrape_once()
                done.set()

            threading.Thread(target=scrape_twice, daemon=True).start()
            assert done.wait(20), "the scrape never returned: one slow target froze the dashboard"
            snap = tracker.snapshot()
    finally:
        stop.set()
        slow.shutdown()
        slow.server_close()
    status = {t["url"]: t for t in snap["targets"]}
    assert status[server.url]["up"] and status[server.url]["scrapes"] == 2
    assert not status[slow_url]["up"] and status[slow_url]["errors"] == 2
    assert "TimeoutError" in status[slow_url]["last_error"]
    images = next(c for c in snap["charts"] if c["id"] == "images_per_second")
    assert images["series"]["images"][-1][1] > 0
