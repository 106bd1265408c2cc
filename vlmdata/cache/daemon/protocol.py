"""Wire format between readers and the cache daemon: length-prefixed JSON messages.

Each message is a 4-byte big-endian length then that many bytes of UTF-8 JSON (an object), at most
`MAX_MESSAGE` bytes (a longer declared length is refused before anything is read or allocated).
Requests: {"op": "get", "ref": REF} -> {"ok": true, "path": P, "size": N} (the reader mmaps P);
{"op": "plan", "refs": [REF...]} -> {"ok": true}; {"op": "stats"} -> {"ok": true, "stats": {...}};
{"op": "ping"} -> {"ok": true}; {"op": "hello", "token": T} -> {"ok": true} (the first message on TCP);
{"op": "register", "prefixes": [URL...]} -> {"ok": true} (over the Unix socket: datasets to serve).
Errors: {"ok": false, "error": E, "message": M} with E one of "fetch" (the store failed), "bad_key",
"bad_request", "auth" (TCP without the token), "forbidden" (not a dataset the daemon serves), "no_room"
(the SSD budget is held by pinned entries: read it directly), "busy" (too many connections).
REF = {"url": str, "size": int|null, "crc32": int|null, "key": str}. Nothing is ever unpickled.
"""
from __future__ import annotations

import json
import socket
import struct

from vlmdata.cache.fetch import ShardRef
from vlmdata.errors import ProtocolError

MAX_MESSAGE = 64 << 20        # a plan of ~300k shards; larger frames are refused unread
_HEADER = struct.Struct(">I")


def send_msg(sock: socket.socket, obj: dict, max_bytes: int = MAX_MESSAGE) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    if len(data) > max_bytes:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {max_bytes}")
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytearray | None:
    """n bytes, grown as they arrive (a declared length allocates nothing until the bytes come)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            if buf:
                raise ConnectionError("connection closed mid-message")
            return None
        buf += chunk
    return buf


def recv_msg(sock: socket.socket, max_bytes: int = MAX_MESSAGE) -> dict | None:
    """The next message, or None at a clean end of stream; ProtocolError for a frame over `max_bytes`."""
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    (n,) = _HEADER.unpack(header)
    if n > max_bytes:
        raise ProtocolError(f"message of {n} bytes exceeds the {max_bytes}-byte limit")
    body = _recv_exact(sock, n)
    if body is None:
        raise ConnectionError("connection closed mid-message")
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"bad JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("message is not a JSON object")
    return obj


def ref_to_wire(ref: ShardRef) -> dict:
    return {"url": ref.url, "size": ref.size, "crc32": ref.crc32, "key": ref.key}


def ref_from_wire(d) -> ShardRef:
    if not isinstance(d, dict):
        raise ProtocolError("ref must be an object")
    url, size, crc, key = d.get("url"), d.get("size"), d.get("crc32"), d.get("key", "")
    if not isinstance(url, str) or not isinstance(key, str):
        raise ProtocolError("ref.url and ref.key must be strings")
    for v in (size, crc):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise ProtocolError("ref.size and ref.crc32 must be non-negative integers or null")
    return ShardRef(url=url, size=size, crc32=crc, key=key)


def parse_address(address: str) -> tuple[int, object]:
    """("unix", path) or ("tcp", (host, port)) from a daemon address; TCP must be loopback."""
    if address.startswith("tcp://"):
        host, _, port = address[len("tcp://"):].rpartition(":")
        if host not in ("127.0.0.1", "localhost"):
            raise ValueError(f"cache daemon TCP address must be 127.0.0.1, got {host!r}")
        return socket.AF_INET, ("127.0.0.1", int(port))
    path = address[len("unix://"):] if address.startswith("unix://") else address
    return socket.AF_UNIX, path


def connect(address: str, timeout: float | None = None) -> socket.socket:
    family, addr = parse_address(address)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(addr)
    except BaseException:
        sock.close()
        raise
    return sock
