"""The dashboard web server: the static page, and the scraped chart data as JSON.

Stdlib only: a ThreadingHTTPServer for the page and `/api/data`, and one
thread that scrapes the targets every `interval` seconds (server-side, so the
browser never needs access to the metrics endpoints).
"""
from __future__ import annotations

import json
import logging
import mimetypes
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources

from vlmdata.dashboard.scrape import RateTracker

log = logging.getLogger(__name__)

STATIC_FILES = ("index.html", "app.js", "style.css")


@dataclass
class DashboardConfig:
    """Where to listen, what to scrape and how often."""

    targets: list[str]
    port: int = 8080
    host: str = "127.0.0.1"
    interval: float = 2.0
    history: int = 600
    timeout: float = 5.0


def _static(name: str) -> bytes:
    return resources.files("vlmdata.dashboard").joinpath("static", name).read_bytes()


def _handler_for(dash: Dashboard) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?", 1)[0]
            if path == "/api/data":
                body = json.dumps(dash.data(), allow_nan=False).encode()
                return self._send(200, "application/json", body)
            name = "index.html" if path in ("/", "/index.html") else path.removeprefix("/static/")
            if name not in STATIC_FILES:
                return self._send(404, "text/plain; charset=utf-8", b"not found\n")
            ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
            return self._send(200, f"{ctype}; charset=utf-8", _static(name))

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
            log.debug("dashboard http: " + format, *args)

    return Handler


class Dashboard:
    """Scrapes `config.targets` in a thread and serves the page; `.url` once started."""

    def __init__(self, config: DashboardConfig):
        if config.interval <= 0:
            raise ValueError(f"--interval must be > 0 seconds, got {config.interval}")
        self.config = config
        self.tracker = RateTracker(config.targets, history=config.history, timeout=config.timeout)
        self._stop = threading.Event()
        self._httpd = ThreadingHTTPServer((config.host, config.port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._threads = [
            threading.Thread(target=self._httpd.serve_forever, name="vlmdata-dashboard-http", daemon=True),
            threading.Thread(target=self._scrape_loop, name="vlmdata-dashboard-scrape", daemon=True),
        ]
        for t in self._threads:
            t.start()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self._httpd.server_address[0]}:{self.port}/"

    def data(self) -> dict:
        snap = self.tracker.snapshot()
        snap["interval"] = self.config.interval
        return snap

    def _scrape_loop(self) -> None:
        while not self._stop.is_set():
            self.tracker.scrape_once()
            self._stop.wait(self.config.interval)

    def close(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        for t in self._threads:
            t.join(timeout=10)

    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
