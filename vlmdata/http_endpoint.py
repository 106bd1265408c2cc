"""A small read-only HTTP endpoint served from a daemon thread (metrics, dashboard).

    endpoint = HttpEndpoint(respond, host="127.0.0.1", port=0, name="metrics")
    endpoint.url("/metrics")
    endpoint.close()

`respond(path) -> Response` maps the request path (query string removed) to
what is sent back; GET is the only method. Stdlib only.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["HttpEndpoint", "Response", "TEXT", "not_found"]

log = logging.getLogger(__name__)

TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class Response:
    """One reply: status, content type and body."""

    code: int
    content_type: str
    body: bytes


def not_found() -> Response:
    return Response(404, TEXT, b"not found\n")


class HttpEndpoint:
    """Serves `respond` on (host, port) from a daemon thread; `port=0` binds any free port."""

    def __init__(self, respond: Callable[[str], Response], host: str, port: int, name: str,
                 headers: dict[str, str] | None = None):
        self.name = name
        self._httpd = ThreadingHTTPServer((host, port), _handler_for(respond, name, dict(headers or {})))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=f"vlmdata-{name}-http", daemon=True)
        self._thread.start()

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def url(self, path: str = "/") -> str:
        """A dialable URL for `path` (a wildcard bind address is replaced by loopback)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        host = host if ":" not in host else f"[{host}]"
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


def _handler_for(respond: Callable[[str], Response], name: str,
                 headers: dict[str, str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            reply = respond(self.path.split("?", 1)[0])
            self.send_response(reply.code)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(reply.body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
            log.debug(f"{name} http: " + format, *args)

    return Handler
