"""The per-node cache daemon: access control, once-per-node fetching, death and restart, SIGTERM."""
from __future__ import annotations

import os
import signal
import socket
import stat
import tempfile
import threading
import urllib.request
from pathlib import Path

import pytest
from cache_fixtures import daemon_process, make_shards, wait_for

from vlmdata.cache import CacheConfig, RetryPolicy, ShardRef
from vlmdata.cache.daemon import CacheDaemon, DaemonClient, DaemonOptions, connect, recv_msg, send_msg
from vlmdata.errors import BadKeyError

FAST_RETRY = RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.002)


@pytest.fixture
def daemon(tmp_path):
    sockdir = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp"))  # short path (AF_UNIX limit)
    opts = DaemonOptions(cache_dir=str(tmp_path / "ssd"), disk_bytes=1 << 24, socket_path=str(sockdir / "d.sock"),
                         tcp_port=0, prefetch_bytes=0, retry=FAST_RETRY)
    d = CacheDaemon(opts)
    d.start()
    yield d
    d.stop()
    os.rmdir(sockdir)


def _client(address: str, **kw) -> DaemonClient:
    return DaemonClient(CacheConfig(daemon=address, memory_bytes=1 << 20, prefetch_bytes=0, retry=FAST_RETRY, **kw))


def _listening_on(port: int) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp) listening on `port`."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            addr, p = f[1].rsplit(":", 1)
            if int(p, 16) == port and f[3] == "0A":
                out.append(addr)
    return out


def _non_loopback_ipv4() -> list[str]:
    import fcntl
    import struct

    ips = []
    for _, name in socket.if_nameindex():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            ip = socket.inet_ntoa(raw[20:24])
            if not ip.startswith("127."):
                ips.append(ip)
        except OSError:
            pass
        finally:
            s.close()
    return ips


def test_socket_is_private_and_tcp_is_loopback_only(daemon, tmp_path):
    sock_path = daemon.opts.socket_path
    assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(daemon.cache.disk.root).st_mode) == 0o700
    host, port = daemon.tcp_address
    assert host == "127.0.0.1"
    assert _listening_on(port) == ["0100007F"]  # the kernel's view: bound to 127.0.0.1 only
    for ip in _non_loopback_ipv4():
        with pytest.raises(OSError):
            socket.create_connection((ip, port), timeout=2).close()
    connect(f"tcp://127.0.0.1:{port}", timeout=2).close()
    with pytest.raises(ValueError, match="127.0.0.1"):
        connect(f"tcp://0.0.0.0:{port}")
    if os.geteuid() == 0:  # another user cannot connect to the socket (its directory is world-readable)
        os.chmod(os.path.dirname(sock_path), 0o755)
        def as_nobody() -> str:
            pid = os.fork()
            if pid == 0:  # child: drop to user nobody, try to connect, report by exit code
                code = 3
                try:
                    os.setgid(65534)
                    os.setuid(65534)
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.connect(sock_path)
                    code = 0
                except PermissionError:
                    code = 1
                except BaseException:
                    code = 2
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            return {0: "connected", 1: "denied"}.get(os.waitstatus_to_exitcode(status), "error")

        assert as_nobody() == "denied"
        os.chmod(sock_path, 0o666)  # control: the same probe succeeds once the mode allows it
        assert as_nobody() == "connected"
        os.chmod(sock_path, 0o600)


def test_each_shard_fetched_once_for_many_readers(daemon, tmp_path):
    refs = make_shards(tmp_path / "src", 8, size=20_000)
    want = {r.key: Path(r.url).read_bytes() for r in refs}
    errors: list = []

    def reader(i: int) -> None:
        c = _client(daemon.opts.socket_path)
        order = refs[i:] + refs[:i]
        c.plan_ahead(order)
        for r in order:
            if bytes(c.get(r)) != want[r.key]:
                errors.append(r.key)
        if c.daemon_gets != len(refs) or c.fallback_gets != 0:
            errors.append(f"reader {i}: {c.stats()}")
        c.close()

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    s = daemon.cache.stats.to_dict()
    assert not errors
    assert s["remote_fetches"] == len(refs)  # once per node, not once per reader
    assert s["remote_bytes"] == sum(r.size for r in refs)
    assert s["hits"]["disk"] + s["hits"]["remote"] + s["joined"] == 4 * len(refs)
    wait_for(lambda: not daemon.cache._pins, what="pins released when the readers left")
    wait_for(lambda: not daemon.cache.plans.plans, what="plans dropped when the readers left")


def test_bad_keys_and_bad_requests_rejected(daemon, tmp_path):
    c = _client(daemon.opts.socket_path)
    with pytest.raises(BadKeyError):
        c.get(ShardRef(url="s3://b/x", key="../../etc/passwd"))
    raw = connect(daemon.opts.socket_path, timeout=5)
    for key in ("../x", "/etc/passwd", "a/../../b"):
        send_msg(raw, {"op": "get", "ref": {"url": "s3://b/x", "size": None, "crc32": None, "key": key}})
        assert recv_msg(raw)["error"] == "bad_key"
    send_msg(raw, {"op": "get", "ref": {"url": "/tmp/../etc/passwd", "size": None, "crc32": None, "key": ""}})
    assert recv_msg(raw)["error"] == "bad_key"
    send_msg(raw, {"op": "nope"})
    assert recv_msg(raw)["error"] == "bad_request"
    raw.sendall(b"\x00\x00\x00\x03abc")  # not JSON
    assert recv_msg(raw)["error"] == "bad_request"
    raw.close()
    assert not any(p.suffix == ".data" for p in Path(daemon.cache.disk.root).iterdir())


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
    c = _client(f"tcp://127.0.0.1:{daemon.tcp_address[1]}")
    c.plan_ahead(refs)
    assert [bytes(c.get(r)) for r in refs] == [Path(r.url).read_bytes() for r in refs]
    assert c.daemon_gets == 2 and c.fallback_gets == 0
    c.close()


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
