"""What a data row may read at shard time: paths under the image root only (no `..`, absolute paths or symlinks
out of it), remote URLs only when allowed (and only from allowed hosts), regular files only, at most
--max-image-bytes, remote reads with a deadline; a rejected file's bytes never reach any output."""
from __future__ import annotations

import http.server
import json
import os
import threading

import pytest

from tests.helpers.shards import jpeg, shard, wds_samples
from vlmdata.errors import ConfigError, RowProblem
from vlmdata.ingest import AccessPolicy, read_ref, resolve_ref

SECRET = b"root:*:0:0:secret-password-line\n"


def conv(text="<image>describe"):
    return [{"from": "human", "value": text}, {"from": "gpt", "value": "an answer"}]


class _Handler(http.server.BaseHTTPRequestHandler):
    image = jpeg(32, 24)
    release = threading.Event()

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/img.jpg":
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.image)))
            self.end_headers()
            self.wfile.write(self.image)
        elif self.path == "/endless":          # ignores Range and never ends
            self.send_response(200)
            self.end_headers()
            try:
                while not self.release.is_set():
                    self.wfile.write(b"\xff" * 65536)
            except (BrokenPipeError, ConnectionResetError):
                pass
        elif self.path == "/slow":             # answers only when the test is over
            self.release.wait(60)
        else:
            self.send_response(404)
            self.end_headers()


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    _Handler.release.set()
    srv.shutdown()
    srv.server_close()


def reason(ref, root, policy: AccessPolicy | None = None, so=None) -> str:
    policy = policy or AccessPolicy()
    with pytest.raises(RowProblem) as e:
        read_ref(ref, str(root), policy, so)
    return e.value.reason


def test_references_stay_under_the_root(tmp_path):
    root = tmp_path / "data"
    (root / "imgs").mkdir(parents=True)
    (root / "imgs" / "a.jpg").write_bytes(jpeg())
    (tmp_path / "outside.jpg").write_bytes(jpeg())
    (root / "imgs" / "in_link.jpg").symlink_to(root / "imgs" / "a.jpg")
    (root / "imgs" / "out_link.jpg").symlink_to(tmp_path / "outside.jpg")
    (root / "imgs" / "dir_link").symlink_to(tmp_path)
    assert read_ref("imgs/a.jpg", str(root), AccessPolicy()) == jpeg()
    assert read_ref("imgs/in_link.jpg", str(root), AccessPolicy()) == jpeg()   # a symlink that stays inside
    assert read_ref(str(root / "imgs" / "a.jpg"), str(root), AccessPolicy()) == jpeg()
    for ref in ("../outside.jpg", "imgs/../../outside.jpg", str(tmp_path / "outside.jpg"),
                f"file://{tmp_path / 'outside.jpg'}", "imgs/out_link.jpg", "imgs/dir_link/outside.jpg",
                "/etc/passwd"):
        assert reason(ref, root) == "outside_root", ref


def test_only_regular_files_within_the_byte_limit(tmp_path):
    (tmp_path / "big.jpg").write_bytes(b"\xff\xd8\xff" + b"\0" * 5000)
    os.mkfifo(tmp_path / "pipe.jpg")                      # opening it for reading would block forever
    os.symlink("/dev/zero", tmp_path / "zero.jpg")        # endless: would exhaust memory
    assert reason("/dev/zero", "/dev") == "not_a_regular_file"
    assert reason("pipe.jpg", tmp_path) == "not_a_regular_file"
    assert reason("zero.jpg", tmp_path) == "outside_root"  # the link leads out of the root first
    assert reason("big.jpg", tmp_path, AccessPolicy(max_bytes=4096)) == "file_too_large"
    assert len(read_ref("big.jpg", str(tmp_path), AccessPolicy(max_bytes=5003))) == 5003
    assert reason("missing.jpg", tmp_path) == "missing_file"
    assert reason(b"x" * 10, tmp_path, AccessPolicy(max_bytes=9)) == "file_too_large"   # embedded bytes too


def test_remote_urls_only_when_allowed(tmp_path, server):
    url = f"{server}/img.jpg"
    assert reason(url, tmp_path) == "remote_not_allowed"
    allow = AccessPolicy(allow_remote=True)
    assert read_ref(url, str(tmp_path), allow) == _Handler.image
    assert read_ref(url, str(tmp_path), AccessPolicy(allow_remote=True, allow_hosts=("127.0.0.1",))) == _Handler.image
    assert reason(url, tmp_path, AccessPolicy(allow_remote=True, allow_hosts=("images.example.com",))) \
        == "remote_not_allowed"
    assert reason(f"simplecache::file://{tmp_path}/x.jpg", tmp_path, allow) == "remote_not_allowed"
    assert reason(f"memory://{tmp_path}/x.jpg", tmp_path, allow) == "remote_not_allowed"
    assert reason(f"{server}/nothing.jpg", tmp_path, allow) == "missing_file"


def test_remote_reads_are_bounded_in_bytes_and_time(tmp_path, server):
    limited = AccessPolicy(allow_remote=True, max_bytes=1 << 20, timeout=30)
    assert reason(f"{server}/endless", tmp_path, limited) == "file_too_large"
    assert reason(f"{server}/slow", tmp_path, AccessPolicy(allow_remote=True, timeout=1.0)) == "read_timeout"


def test_a_remote_input_is_its_own_root():
    policy = AccessPolicy()
    root = "s3://bucket/data"
    assert resolve_ref("imgs/a.jpg", root, policy) == "s3://bucket/data/imgs/a.jpg"
    assert resolve_ref("s3://bucket/data/imgs/b.jpg", root, policy) == "s3://bucket/data/imgs/b.jpg"
    for ref, why in (("../secret.jpg", "outside_root"), ("/etc/passwd", "outside_root"),
                     ("s3://other-bucket/a.jpg", "remote_not_allowed"),
                     ("s3://bucket/data/../private/a.jpg", "remote_not_allowed")):
        with pytest.raises(RowProblem) as e:
            resolve_ref(ref, root, policy)
        assert e.value.reason == why, ref


def test_policy_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="--allow-host only applies with --allow-remote"):
        AccessPolicy(allow_hosts=("x",)).check()
    with pytest.raises(ConfigError, match="not a directory"):
        AccessPolicy(image_root=str(tmp_path / "nope")).check()
    with pytest.raises(ConfigError, match="--max-image-bytes"):
        AccessPolicy(max_bytes=0).check()


def test_shard_counts_every_rejection_and_copies_no_rejected_byte(tmp_path, server):
    data = tmp_path / "data"
    (data / "imgs").mkdir(parents=True)
    (data / "imgs" / "ok.jpg").write_bytes(jpeg())
    (data / "imgs" / "notes.jpg").write_bytes(SECRET)               # inside the root, not an image
    (tmp_path / "secret.txt").write_bytes(SECRET)
    (data / "imgs" / "leak.jpg").symlink_to(tmp_path / "secret.txt")
    os.mkfifo(data / "imgs" / "fifo.jpg")
    (data / "imgs" / "zero.jpg").symlink_to("/dev/zero")
    refs = {"ok": "imgs/ok.jpg", "notes": "imgs/notes.jpg", "up": "../secret.txt", "abs": str(tmp_path / "secret.txt"),
            "passwd": "/etc/passwd", "link": "imgs/leak.jpg", "fifo": "imgs/fifo.jpg", "zero": "imgs/zero.jpg",
            "http": f"{server}/img.jpg", "chain": f"simplecache::file://{tmp_path}/secret.txt"}
    (data / "rows.jsonl").write_text("".join(json.dumps({"id": k, "image": v, "conversations": conv()}) + "\n"
                                             for k, v in refs.items()))
    m = shard(data / "rows.jsonl", tmp_path / "out")
    assert m.stats["skipped"] == {"not_an_image": 1, "outside_root": 5, "not_a_regular_file": 1,
                                  "remote_not_allowed": 2}
    assert m.stats["input_rows"] == len(refs) and m.num_samples == 1
    everything = b"".join(p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file())
    passwd = open("/etc/passwd", "rb").read(16) if os.access("/etc/passwd", os.R_OK) else SECRET
    assert SECRET[:8] not in everything and b"secret-password" not in everything and passwd not in everything
    assert sorted(wds_samples(tmp_path / "out")) == ["ok"]


def test_image_root_and_allow_remote_flags(tmp_path, server):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.jpg").write_bytes(jpeg())
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "own.jpg").write_bytes(jpeg())
    rows = [{"id": "own", "image": str(tmp_path / "rows" / "own.jpg"), "conversations": conv()},
            {"id": "rel", "image": "a.jpg", "conversations": conv()},
            {"id": "abs", "image": str(tmp_path / "pics" / "a.jpg"), "conversations": conv()},
            {"id": "web", "image": f"{server}/img.jpg", "conversations": conv()}]
    (tmp_path / "rows" / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = shard(tmp_path / "rows" / "d.jsonl", tmp_path / "o1")
    assert m.stats["skipped"] == {"missing_file": 1, "outside_root": 1, "remote_not_allowed": 1}
    m = shard(tmp_path / "rows" / "d.jsonl", tmp_path / "o2", image_root=str(tmp_path / "pics"),
              allow_remote=True, allow_hosts=("127.0.0.1",))
    assert m.num_samples == 3 and m.stats["skipped"] == {"outside_root": 1}   # "own" is outside --image-root
    got = wds_samples(tmp_path / "o2")
    assert got["rel"]["0.jpg"] == jpeg() and got["web"]["0.jpg"] == _Handler.image
