"""The metrics endpoint: binds where told, serves what prometheus_client's parser reads back."""
from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vlmdata.metrics import MetricSet, MetricsServer, StatsDelta, serve_metrics


def scrape(url: str) -> dict:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = (fam.type, s.value)
    return out


def test_endpoint_parses_with_right_values():
    ms = MetricSet()
    ms.absorb(StatsDelta(samples=11, images=4, real_tokens=900, padded_tokens=100, packs=2,
                         skipped=Counter({"decode_error": 3})), rank=0)
    ms.record_fetch("remote", hit=False, nbytes=12345)
    ms.record_fetch("memory", hit=True)
    ms.observe_step(0.2, rank=0)
    ms.cache_bytes.labels(tier="memory").set(2048)
    with MetricsServer(ms) as server:  # port 0: ephemeral
        assert server.host == "127.0.0.1" and server.port > 0
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        got = scrape(server.url)
    r0 = (("rank", "0"),)
    assert got[("vlmdata_samples_total", r0)] == ("counter", 11)
    assert got[("vlmdata_images_total", r0)] == ("counter", 4)
    assert got[("vlmdata_real_tokens_total", r0)] == ("counter", 900)
    assert got[("vlmdata_padding_tokens_total", r0)] == ("counter", 100)
    assert got[("vlmdata_packs_total", r0)] == ("counter", 2)
    assert got[("vlmdata_skipped_samples_total", (("rank", "0"), ("reason", "decode_error")))] == ("counter", 3)
    assert got[("vlmdata_fetch_bytes_total", (("tier", "remote"),))] == ("counter", 12345)
    assert got[("vlmdata_cache_hits_total", (("tier", "memory"),))] == ("counter", 1)
    assert got[("vlmdata_cache_misses_total", (("tier", "remote"),))] == ("counter", 1)
    assert got[("vlmdata_cache_bytes", (("tier", "memory"),))] == ("gauge", 2048)
    assert got[("vlmdata_step_duration_seconds_count", r0)] == ("histogram", 1)
    assert got[("vlmdata_step_duration_seconds_bucket", (("le", "0.3"), ("rank", "0")))] == ("histogram", 1)


def test_configured_port_and_live_updates():
    with socket.socket() as s:  # find a free port, then ask the server for exactly that one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ms = MetricSet()
    server = serve_metrics(ms, port=port)
    try:
        assert server.port == port
        ms.absorb(StatsDelta(samples=1), rank=5)
        assert scrape(server.url)[("vlmdata_samples_total", (("rank", "5"),))][1] == 1
        ms.absorb(StatsDelta(samples=2), rank=5)
        assert scrape(server.url)[("vlmdata_samples_total", (("rank", "5"),))][1] == 3
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=10)
        assert err.value.code == 404
        # a second server on the same port is a clear error, not a silent success
        with pytest.raises(OSError):
            MetricsServer(ms, port=port)
    finally:
        server.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=5)


def test_bind_address_from_environment(monkeypatch):
    monkeypatch.setenv("VLMDATA_METRICS_HOST", "0.0.0.0")
    with MetricsServer(MetricSet()) as server:
        assert server.host == "0.0.0.0"
        assert server.url.startswith("http://127.0.0.1:")  # still a dialable URL
        text = urllib.request.urlopen(server.url, timeout=10).read().decode()
    assert "# TYPE vlmdata_samples_total counter" in text
    monkeypatch.delenv("VLMDATA_METRICS_HOST")
    with MetricsServer(MetricSet()) as server:
        assert server.host == "127.0.0.1"
