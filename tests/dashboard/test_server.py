"""The dashboard's HTTP server: the page, its local assets (no CDN), the data API, no path traversal."""
from __future__ import annotations

import json
import urllib.request

import pytest

from vlmdata.dashboard import CHARTS, Dashboard, DashboardConfig
from vlmdata.metrics import MetricSet, MetricsServer


def test_dashboard_serves_page_assets_and_data():
    ms = MetricSet()
    with MetricsServer(ms) as server, Dashboard(DashboardConfig([server.url], port=0, interval=30)) as dash:
        page = urllib.request.urlopen(dash.url, timeout=10).read().decode()
        assert '<script src="/static/app.js">' in page and "http" not in page.split("<body", 1)[1].split("footer")[0]
        for asset in ("app.js", "style.css"):
            body = urllib.request.urlopen(dash.url + "static/" + asset, timeout=10).read()
            assert len(body) > 200 and b"cdn" not in body.lower()
        data = json.loads(urllib.request.urlopen(dash.url + "api/data", timeout=10).read())
        assert [c["id"] for c in data["charts"]] == [c.id for c in CHARTS]
        assert data["targets"][0]["url"] == server.url and data["interval"] == 30
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(dash.url + "static/../metrics.py", timeout=10)
