"""Another local user against the cache daemon and its readers: TCP connections without the token cannot take the
owner's slots; a cache folder, socket or token file another user owns (or a symlink) is refused, never used
(tests run as root: "another user" is a chown to uid 12345)."""
from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import pytest

from tests.helpers.cache import FAST_RETRY, make_shards, wait_for
from tests.helpers.cache import daemon_client as _client
from vlmdata.cache.daemon import (
    CacheDaemon,
    ConnectionLimits,
    DaemonOptions,
    connect,
    read_token,
    recv_msg,
    send_msg,
)
from vlmdata.errors import UnsafePathError

OTHER = 12345


@pytest.fixture
def sockdir():
    d = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp"))       # short path (AF_UNIX limit)
    yield d
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


def start(tmp_path, sockdir, **limits) -> CacheDaemon:
    d = CacheDaemon(DaemonOptions(cache_dir=str(tmp_path / "ssd"), disk_bytes=1 << 22,
                                  socket_path=str(sockdir / "d.sock"), tcp_port=0, prefetch_bytes=0,
                                  retry=FAST_RETRY, limits=ConnectionLimits(**limits)))
    d.start()
    return d


def busy(sock: socket.socket) -> bool:
    """True if the daemon answered this fresh connection with "busy" (it says so at once, then closes)."""
    sock.settimeout(0.5)
    try:
        reply = recv_msg(sock)
    except TimeoutError:
        return False
    return reply is not None and reply.get("error") == "busy"


def test_connections_without_the_token_never_take_the_owners_slots(tmp_path, sockdir):
    d = start(tmp_path, sockdir, max_connections=2, max_unauthenticated=2, auth_timeout=30)
    try:
        strangers = []
        while True:                                   # any local user: TCP connections that never give the token
            s = connect(f"tcp://127.0.0.1:{d.tcp_address[1]}", timeout=20)
            strangers.append(s)
            if busy(s):
                break
            assert len(strangers) <= 8
        readers = [connect(str(sockdir / "d.sock"), timeout=20) for _ in range(2)]
        for r in readers:                             # the owner's readers on the Unix socket are all served
            send_msg(r, {"op": "ping"})
            assert recv_msg(r) == {"ok": True}
        token = read_token(d.token.path)
        for s in strangers:
            s.close()
        for r in readers:
            r.close()
        wait_for(lambda: d.unauthenticated == 0, what="the strangers' slots released")
        late = connect(f"tcp://127.0.0.1:{d.tcp_address[1]}", timeout=20)
        send_msg(late, {"op": "hello", "token": token})   # the stranger slots are free again once they leave
        assert recv_msg(late) == {"ok": True}
        late.close()
    finally:
        d.stop()


def test_a_silent_tcp_connection_is_dropped_after_the_auth_timeout(tmp_path, sockdir):
    d = start(tmp_path, sockdir, max_unauthenticated=1, auth_timeout=0.5)
    try:
        s = connect(f"tcp://127.0.0.1:{d.tcp_address[1]}", timeout=20)
        s.settimeout(20)
        assert recv_msg(s) is None                    # closed by the daemon, not by us
        s.close()
    finally:
        d.stop()


def test_a_cache_folder_of_another_user_is_refused(tmp_path, sockdir):
    (tmp_path / "ssd").mkdir()
    os.chown(tmp_path / "ssd", OTHER, OTHER)
    with pytest.raises(UnsafePathError, match="owned by .*uid 12345"):
        start(tmp_path, sockdir)
    assert os.stat(tmp_path / "ssd").st_uid == OTHER


def test_a_socket_another_user_left_at_the_path_is_refused_not_removed(tmp_path, sockdir):
    planted = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    planted.bind(str(sockdir / "d.sock"))
    planted.close()                                   # a stale socket, but theirs
    os.chown(sockdir / "d.sock", OTHER, OTHER)
    with pytest.raises(UnsafePathError, match="owned by .*uid 12345"):
        start(tmp_path, sockdir)
    assert os.path.lexists(sockdir / "d.sock")


def test_a_socket_folder_others_can_write_is_refused(tmp_path):
    shared = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp"))
    try:
        os.chmod(shared, 0o777)                       # not sticky: anyone could swap the socket
        with pytest.raises(UnsafePathError, match="writable by others"):
            start(tmp_path, shared)
    finally:
        shared.rmdir()


def test_readers_do_not_talk_to_a_socket_another_user_owns(tmp_path, sockdir):
    d = start(tmp_path, sockdir)
    try:
        refs = make_shards(tmp_path / "src", 1)
        os.chown(sockdir / "d.sock", OTHER, OTHER)    # e.g. their own listener at the path we were given
        c = _client(str(sockdir / "d.sock"))
        assert bytes(c.get(refs[0])) == Path(refs[0].url).read_bytes()
        assert c.daemon_gets == 0 and c.fallback_gets == 1
        c.close()
        os.chown(sockdir / "d.sock", 0, 0)
    finally:
        d.stop()


def test_a_token_path_symlinked_to_another_file_is_not_read(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root-only secret\n")
    os.symlink(secret, tmp_path / "d.token")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        read_token(str(tmp_path / "d.token"))
    theirs = tmp_path / "theirs.token"
    theirs.write_text("abc\n")
    os.chown(theirs, OTHER, OTHER)
    with pytest.raises(UnsafePathError, match="owned by .*uid 12345"):
        read_token(str(theirs))
