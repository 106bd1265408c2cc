"""The daemon client: loopback TCP, fetch errors through the daemon, falling back to direct fetching when
the daemon is absent or dies mid-epoch, reconnecting when it is back."""
from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest

from tests.helpers.cache import daemon_client as _client
from tests.helpers.cache import daemon_process, make_shards
from vlmdata.cache import ShardRef
from vlmdata.cache.daemon import connect, recv_msg, send_msg


@pytest.mark.integration  # the daemon runs as a subprocess
def test_daemon_death_mid_epoch_loses_no_sample_and_restart_reuses_ssd(tmp_path):
    refs = make_shards(tmp_path / "src", 30, size=10_000)
    want = [Path(r.url).read_bytes() for r in refs]
    sock = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp")) / "d.sock"
    ssd = tmp_path / "ssd"
    args = ["--prefetch-bytes", "0"]
    with daemon_process(ssd, sock, 1 << 24, args) as proc:
        c = _client(str(sock))
        c.reconnect_seconds = 3600.0  # stay on the fallback for the rest of this epoch
        c.plan_ahead(refs)
        got = [bytes(c.get(r)) for r in refs[:12]]
        assert c.daemon_gets == 12
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        got += [bytes(c.get(r)) for r in refs[12:]]
    assert got == want  # every sample of the epoch, intact
    assert c.daemon_gets == 12 and c.fallback_gets == 18 and c.disconnects == 1
    # the fallback followed the rest of the plan
    assert c.stats()["fallback"]["remote_fetches"] == 18
    with daemon_process(ssd, sock, 1 << 24, args):
        c.reconnect_seconds = 0.0
        assert bytes(c.get(refs[0])) == want[0]  # reconnected
        assert c.daemon_gets == 13
        c2 = _client(str(sock))
        assert [bytes(c2.get(r)) for r in refs] == want
        raw = connect(str(sock), timeout=5)
        send_msg(raw, {"op": "stats"})
        stats = recv_msg(raw)["stats"]
        raw.close()
        c2.close()
    c.close()
    assert stats["hits"]["disk"] == 12 + 1  # what the first daemon stored was reused, verified
    assert stats["remote_fetches"] == 18
    os.rmdir(sock.parent)


def test_absent_daemon_falls_back_to_direct_fetching(tmp_path):
    refs = make_shards(tmp_path / "src", 3)
    c = _client("/tmp/no-such-daemon.sock")
    c.plan_ahead(refs)
    assert [bytes(c.get(r)) for r in refs] == [Path(r.url).read_bytes() for r in refs]
    assert c.daemon_gets == 0 and c.fallback_gets == 3
    c.close()


def test_remote_failure_through_daemon_is_a_fetch_error(daemon, tmp_path):
    from vlmdata.errors import FetchError

    refs = make_shards(tmp_path / "src", 1)
    c = _client(daemon.opts.socket_path)
    with pytest.raises(FetchError):
        c.get(ShardRef(url=str(tmp_path / "missing.tar"), size=10, crc32=1))
    assert bytes(c.get(refs[0])) == Path(refs[0].url).read_bytes()  # the connection is still usable
    assert c.daemon_gets == 1 and c.fallback_gets == 0
    assert daemon.cache.stats.to_dict()["fetch_errors"] == 1
    c.close()


def test_client_over_loopback_tcp(daemon, tmp_path):
    refs = make_shards(tmp_path / "src", 2)
    unix = _client(daemon.opts.socket_path)        # registers the dataset over the Unix socket
    unix.plan_ahead(refs)
    unix.close()
    c = _client(f"tcp://127.0.0.1:{daemon.tcp_address[1]}", daemon_token_file=daemon.token.path)
    c.plan_ahead(refs)
    assert [bytes(c.get(r)) for r in refs] == [Path(r.url).read_bytes() for r in refs]
    assert c.daemon_gets == 2 and c.fallback_gets == 0
    c.close()
