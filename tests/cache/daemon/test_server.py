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
