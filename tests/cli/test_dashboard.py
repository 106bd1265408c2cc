"""`vlmdata dashboard`: argument parsing and configuration errors, and the command end to end (no browser)."""
from __future__ import annotations

import json
import urllib.request

import pytest

from vlmdata.cli import build_parser
from vlmdata.dashboard import Dashboard, DashboardConfig, RateTracker
from vlmdata.metrics import MetricSet, MetricsServer, StatsDelta


def test_cli_parses_targets_and_rejects_bad_config():
    args = build_parser().parse_args(["dashboard", "--targets", "a:1,b:2", "--targets", "c:3", "--port", "0"])
    from vlmdata.cli import parse_targets
    assert parse_targets(args.targets) == ["a:1", "b:2", "c:3"] and args.port == 0 and args.host == "127.0.0.1"
    with pytest.raises(ValueError, match="interval"):
        Dashboard(DashboardConfig(["a:1"], port=0, interval=0))
    with pytest.raises(ValueError, match="no scrape targets"):
        RateTracker([])


def test_dashboard_command_end_to_end():
    import subprocess
    import sys

    ms = MetricSet()
    ms.absorb(StatsDelta(images=1), rank=0)
    with MetricsServer(ms) as server:
        proc = subprocess.Popen([sys.executable, "-m", "vlmdata", "dashboard", "--targets", server.url,
                                 "--port", "0", "--interval", "0.2"], stdout=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()
            assert line.startswith("dashboard at http://127.0.0.1:"), line
            url = line.split()[2]
            page = urllib.request.urlopen(url, timeout=10).read().decode()
            assert "vlmdata dashboard" in page
            data = json.loads(urllib.request.urlopen(url + "api/data", timeout=10).read())
            assert data["targets"][0]["url"] == server.url
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        assert proc.returncode in (0, -15, 130)



def test_cli_refuses_non_http_targets():
    import subprocess
    import sys

    from tests.helpers.paths import REPO

    out = subprocess.run([sys.executable, "-m", "vlmdata", "dashboard", "--targets", "file:///etc/passwd",
                          "--port", "0"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "file:///etc/passwd" in out.stderr and "http" in out.stderr and "root:" not in out.stdout + out.stderr
