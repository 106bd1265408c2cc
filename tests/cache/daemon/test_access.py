"""The cache daemon serves only its datasets, to clients that may use it: the TCP listener needs the token from
a 0600 file, anything outside the allowed (or registered) dataset prefixes is refused before it is touched,
and a refusal reads the same whether the object exists or not."""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from tests.helpers.cache import FAST_RETRY, make_shards
from tests.helpers.cache import daemon_client as _client
from vlmdata.cache.daemon import CacheDaemon, DaemonOptions, connect, recv_msg, send_msg


def wire(url: str, size=None, crc=None, key: str = "") -> dict:
    return {"url": url, "size": size, "crc32": crc, "key": key}


def tcp(daemon, token: str | None = None):
    raw = connect(f"tcp://127.0.0.1:{daemon.tcp_address[1]}", timeout=10)
    if token is not None:
        send_msg(raw, {"op": "hello", "token": token})
        assert recv_msg(raw) == {"ok": True}
    return raw


def ask(raw, msg: dict) -> dict:
    send_msg(raw, msg)
    return recv_msg(raw)


@pytest.fixture
def guarded(tmp_path):
    """A daemon serving only tmp_path/ds (--allow), on a Unix socket and loopback TCP."""
    allowed = tmp_path / "ds"
    refs = make_shards(allowed, 2, size=5000)
    sockdir = Path(tempfile.mkdtemp(prefix="vlmd-", dir="/tmp"))
    d = CacheDaemon(DaemonOptions(cache_dir=str(tmp_path / "ssd"), disk_bytes=1 << 22, socket_path=str(sockdir / "d.sock"),
                                  tcp_port=0, prefetch_bytes=0, retry=FAST_RETRY, allow=[str(allowed)]))
    d.start()
    yield d, refs
    d.stop()
    os.rmdir(sockdir)


def test_tcp_needs_the_token_from_a_private_file(guarded):
    d, refs = guarded
    token_file = Path(d.token.path)
    assert token_file.parent == Path(d.opts.socket_path).parent
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert len(token) == 64
    get = {"op": "get", "ref": wire(refs[0].url, refs[0].size, refs[0].crc32, refs[0].key)}
    for hello in (None, {"op": "hello", "token": "0" * 64}, {"op": "hello"}):
        raw = tcp(d)
        reply = ask(raw, hello or get)
        assert reply["ok"] is False and reply["error"] == "auth"
        assert recv_msg(raw) is None                          # and the connection is closed
        raw.close()
    assert d.cache.stats.to_dict()["remote_fetches"] == 0     # nothing was read for them
    raw = tcp(d, token)
    reply = ask(raw, get)
    assert reply["ok"] and Path(reply["path"]).read_bytes() == Path(refs[0].url).read_bytes()
    raw.close()
    c = _client(f"tcp://127.0.0.1:{d.tcp_address[1]}", daemon_token_file=str(token_file))
    assert bytes(c.get(refs[1])) == Path(refs[1].url).read_bytes() and c.daemon_gets == 1
    c.close()
    d.stop()
    assert not token_file.exists()                            # removed with the daemon


def test_only_allowed_datasets_are_served_and_refusals_reveal_nothing(guarded, tmp_path):
    d, refs = guarded
    secret = tmp_path / "secret.txt"
    secret.write_text("root:*:0:0\n" * 100)
    os.symlink(tmp_path, Path(refs[0].url).parent / "escape")  # a link inside the served folder pointing out
    raw = tcp(d, d.token.token)
    outside = [str(secret), str(tmp_path / "no-such-file"), "/etc/passwd", "file:///etc/passwd",
               str(Path(refs[0].url).parent / "escape" / "secret.txt"), f"simplecache::file://{secret}",
               "http://127.0.0.1:1/x", str(tmp_path / "ds2" / "x.tar")]
    replies = []
    for url in outside:
        for msg in ({"op": "get", "ref": wire(url)}, {"op": "plan", "refs": [wire(url)]}):
            replies.append(ask(raw, msg))
    assert all(r["ok"] is False and r["error"] == "forbidden" for r in replies)
    assert len({r["message"] for r in replies}) == 1          # the same answer, existing or not
    assert "1100" not in str(replies)                         # no size of anything leaked
    assert ask(raw, {"op": "register", "prefixes": [str(tmp_path)]})["error"] == "forbidden"   # not over TCP
    ok = ask(raw, {"op": "get", "ref": wire(refs[0].url, refs[0].size, refs[0].crc32, refs[0].key)})
    assert ok["ok"]
    raw.close()
    assert d.cache.stats.to_dict()["remote_fetches"] == 1
    unix = connect(d.opts.socket_path, timeout=10)            # --allow fixes the list: no registration
    assert ask(unix, {"op": "register", "prefixes": [str(tmp_path)]})["error"] == "forbidden"
    assert ask(unix, {"op": "register", "prefixes": [str(Path(refs[0].url).parent)]})["ok"]
    unix.close()


def test_readers_register_their_datasets_over_the_unix_socket(daemon, tmp_path):
    refs = make_shards(tmp_path / "a", 2)
    other = make_shards(tmp_path / "b", 1, seed=3)
    c = _client(daemon.opts.socket_path)                      # registers tmp_path/a by planning it
    c.plan_ahead(refs)
    assert [bytes(c.get(r)) for r in refs] == [Path(r.url).read_bytes() for r in refs]
    assert c.daemon_gets == 2 and c.read_through_gets == 0
    assert daemon.access.prefixes == [os.path.realpath(tmp_path / "a")]
    t = _client(f"tcp://127.0.0.1:{daemon.tcp_address[1]}", daemon_token_file=daemon.token.path)
    assert bytes(t.get(refs[0])) == Path(refs[0].url).read_bytes() and t.daemon_gets == 1
    # a TCP reader cannot register: the daemon refuses b/, and the reader reads that shard itself
    assert bytes(t.get(other[0])) == Path(other[0].url).read_bytes()
    assert t.read_through_gets == 1 and t.daemon_gets == 1
    assert daemon.access.prefixes == [os.path.realpath(tmp_path / "a")]
    no_token = _client(f"tcp://127.0.0.1:{daemon.tcp_address[1]}")   # no token: falls back, loses nothing
    assert bytes(no_token.get(refs[1])) == Path(refs[1].url).read_bytes()
    assert no_token.daemon_gets == 0 and no_token.fallback_gets == 1
    for x in (c, t, no_token):
        x.close()
