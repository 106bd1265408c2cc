"""Wire format between readers and the cache daemon: length-prefixed JSON messages.

Each message is a 4-byte big-endian length then that many bytes of UTF-8 JSON (an object).
Requests: {"op": "get", "ref": REF} -> {"ok": true, "path": P, "size": N} (the reader mmaps P);
{"op": "plan", "refs": [REF...]} -> {"ok": true}; {"op": "stats"} -> {"ok": true, "stats": {...}};
{"op": "ping"} -> {"ok": true}. Errors: {"ok": false, "error": "fetch"|"bad_key"|"bad_request", "message": M}.
REF = {"url": str, "size": int|null, "crc32": int|null, "key": str}. Nothing is ever unpickled.
"""
from __future__ import annotations

import json
import socket
import struct

from vlmdata.cache.fetch import ShardRef
from vlmdata.errors import ProtocolError

MAX_MESSAGE = 256 << 20
_HEADER = struct.Struct(">I")


def send_msg(sock: socket.socket, obj: dict) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            if buf:
                raise ConnectionError("connection closed mid-message")
            return None
        buf += chunk
    return bytes(buf)


def recv_msg(sock: socket.socket) -> dict | None:
    """The next message, or None at a clean end of stream."""
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    (n,) = _HEADER.unpack(header)
    if n > MAX_MESSAGE:
        raise ProtocolError(f"message of {n} bytes exceeds {MAX_MESSAGE}")
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
