"""`vlmdata cache-daemon` as a subprocess: SIGTERM shuts it down cleanly, metrics are served where
`--metrics-host` says."""
from __future__ import annotations

import os
import signal
import tempfile
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.cache import daemon_client as _client
from tests.helpers.cache import daemon_process, make_shards
from tests.helpers.cache import listening_on as _listening_on

pytestmark = pytest.mark.integration


def test_sigterm_shuts_down_cleanly_and_metrics_are_served(tmp_path):
    refs = make_shards(tmp_path / "src", 3, size=5000)
    sock = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp")) / "d.sock"
    with daemon_process(tmp_path / "ssd", sock, 1 << 24, ["--metrics-port", "0"]) as proc:
        url = None
        while url is None:
            line = proc.stdout.readline()
            assert line, "daemon exited before printing its metrics URL"
            if line.startswith("metrics: "):
                url = line.split(" ", 1)[1].strip()
        c = _client(str(sock))
        for r in refs + refs:
            c.get(r)
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        assert 'vlmdata_cache_hits_total{tier="remote"} 3.0' in text
        assert 'vlmdata_cache_hits_total{tier="disk"} 3.0' in text
        total = float(sum(r.size for r in refs))
        assert f'vlmdata_fetch_bytes_total{{tier="remote"}} {total}' in text
        assert "vlmdata_inflight_fetches 0.0" in text
        proc.send_signal(signal.SIGTERM)  # with a reader still connected
        assert proc.wait(30) == 0
        c.close()
        assert not sock.exists()  # socket removed
        assert "cache daemon stopped" in proc.stderr.read()
    os.rmdir(sock.parent)


@pytest.mark.parametrize("flag, expected", [(None, "0100007F"), ("0.0.0.0", "00000000")])
def test_metrics_host_flag_sets_the_bind_address(tmp_path, monkeypatch, flag, expected):
    """Default: loopback only; `--metrics-host 0.0.0.0` (containers) listens on every interface."""
    monkeypatch.delenv("VLMDATA_METRICS_HOST", raising=False)
    sock = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp")) / "d.sock"
    extra = ["--metrics-port", "0"] + (["--metrics-host", flag] if flag else [])
    with daemon_process(tmp_path / "ssd", sock, 1 << 24, extra) as proc:
        url = None
        while url is None:
            line = proc.stdout.readline()
            assert line, "daemon exited before printing its metrics URL"
            if line.startswith("metrics: "):
                url = line.split(" ", 1)[1].strip()
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert _listening_on(port) == [expected]
        assert b"vlmdata_" in urllib.request.urlopen(url, timeout=10).read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    os.rmdir(sock.parent)
