"""The per-node cache daemon (server side): access control, once-per-node fetching, bad requests."""
from __future__ import annotations

import os
import socket
import stat
import threading
from pathlib import Path

import pytest

from tests.helpers.cache import daemon_client as _client
from tests.helpers.cache import listening_on as _listening_on
from tests.helpers.cache import make_shards, wait_for
from vlmdata.cache import ShardRef
from vlmdata.cache.daemon import connect, recv_msg, send_msg
from vlmdata.errors import BadKeyError


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


def test_oversized_frame_is_refused_unread(daemon):
    import struct

    raw = connect(daemon.opts.socket_path, timeout=10)
    raw.sendall(struct.pack(">I", 100 << 20))                 # declares 100 MiB, sends none of it
    reply = recv_msg(raw)
    assert reply["error"] == "bad_request" and "exceeds" in reply["message"]
    assert recv_msg(raw) is None                              # closed: nothing was waited for or allocated
    raw.close()


@pytest.fixture
def limited(tmp_path):
    """A daemon that serves 3 connections at most and closes them after 1 s of silence."""
    import tempfile

    from tests.helpers.cache import FAST_RETRY
    from vlmdata.cache.daemon import CacheDaemon, ConnectionLimits, DaemonOptions

    sockdir = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp"))
    d = CacheDaemon(DaemonOptions(cache_dir=str(tmp_path / "ssd"), disk_bytes=1 << 22, socket_path=str(sockdir / "d.sock"),
                                  prefetch_bytes=0, retry=FAST_RETRY,
                                  limits=ConnectionLimits(max_connections=3, idle_timeout=1.0)))
    d.start()
    yield d
    d.stop()
    os.rmdir(sockdir)


def test_connections_are_capped_and_idle_ones_closed(limited, tmp_path):
    sock = limited.opts.socket_path
    conns = [connect(sock, timeout=20) for _ in range(3)]
    for c in conns:
        send_msg(c, {"op": "ping"})
        assert recv_msg(c) == {"ok": True}
    extra = connect(sock, timeout=20)
    reply = recv_msg(extra)
    assert reply["ok"] is False and reply["error"] == "busy"
    assert recv_msg(extra) is None
    extra.close()
    for c in conns:                                           # silent for 1 s: closed by the daemon
        assert recv_msg(c) is None
        c.close()
    wait_for(lambda: limited.connections == 0, what="connections released")
    # a reader whose connection was closed while idle reconnects at once and loses nothing
    refs = make_shards(tmp_path / "src", 2)
    c = _client(sock)
    assert bytes(c.get(refs[0])) == Path(refs[0].url).read_bytes()
    wait_for(lambda: limited.connections == 0, what="the idle reader's connection closed")
    assert bytes(c.get(refs[1])) == Path(refs[1].url).read_bytes()
    assert c.daemon_gets == 2 and c.fallback_gets == 0 and c.disconnects == 0
    c.close()


def test_get_reads_at_most_the_declared_size_or_the_budget(tmp_path, monkeypatch):
    """An object larger than its declaration (or than the whole cache) is refused after a bounded read."""
    import tempfile

    import vlmdata.fsutil as fsutil_mod
    from tests.helpers.cache import FAST_RETRY
    from vlmdata.cache.daemon import CacheDaemon, DaemonOptions

    allowed = tmp_path / "ds"
    allowed.mkdir()
    big = allowed / "big.tar"
    with open(big, "wb") as f:
        f.truncate(300 << 20)                                  # 300 MiB (sparse)
    sizes, real = [], fsutil_mod.read_range
    monkeypatch.setattr(fsutil_mod, "read_range", lambda *a, **k: sizes.append(len(out := real(*a, **k))) or out)
    sockdir = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp"))
    d = CacheDaemon(DaemonOptions(cache_dir=str(tmp_path / "ssd"), disk_bytes=1 << 20, socket_path=str(sockdir / "s"),
                                  prefetch_bytes=0, retry=FAST_RETRY, allow=[str(allowed)]))
    d.start()
    try:
        raw = connect(d.opts.socket_path, timeout=30)
        send_msg(raw, {"op": "get", "ref": {"url": str(big), "size": 70 << 20, "crc32": None, "key": ""}})
        assert recv_msg(raw)["error"] == "no_room"             # larger than the whole budget: not even read
        send_msg(raw, {"op": "get", "ref": {"url": str(big), "size": 100_000, "crc32": None, "key": ""}})
        reply = recv_msg(raw)
        assert reply["error"] == "fetch" and "more than its declared" in reply["message"]
        send_msg(raw, {"op": "get", "ref": {"url": str(big), "size": None, "crc32": None, "key": ""}})
        reply = recv_msg(raw)
        assert reply["error"] == "fetch" and "limit" in reply["message"]
        raw.close()
    finally:
        d.stop()
        os.rmdir(sockdir)
    assert max(sizes, default=0) <= (1 << 20) + 1             # never the 300 MiB (a local file is mapped, not read)
    assert sum(p.stat().st_size for p in (tmp_path / "ssd").iterdir() if p.is_file()) < 1 << 20
