"""The dashboard web server: the static page, and the scraped chart data as JSON.

Stdlib only: an `HttpEndpoint` for the page and `/api/data`, and one
thread that scrapes the targets every `interval` seconds (server-side, so the
browser never needs access to the metrics endpoints).
"""
from __future__ import annotations

import json
import logging
import mimetypes
import threading
from dataclasses import dataclass
from importlib import resources

from vlmdata.dashboard.scrape import RateTracker
from vlmdata.http_endpoint import HttpEndpoint, Response, not_found

__all__ = ["Dashboard", "DashboardConfig"]

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


class Dashboard:
    """Scrapes `config.targets` in a thread and serves the page; `.url` once started."""

    def __init__(self, config: DashboardConfig):
        if config.interval <= 0:
            raise ValueError(f"--interval must be > 0 seconds, got {config.interval}")
        self.config = config
        self.tracker = RateTracker(config.targets, history=config.history, timeout=config.timeout)
        self._stop = threading.Event()
        self._endpoint = HttpEndpoint(self._respond, config.host, config.port, "dashboard",
                                      headers={"Cache-Control": "no-store"})
        self._scraper = threading.Thread(target=self._scrape_loop, name="vlmdata-dashboard-scrape", daemon=True)
        self._scraper.start()

    def _respond(self, path: str) -> Response:
        if path == "/api/data":
            return Response(200, "application/json", json.dumps(self.data(), allow_nan=False).encode())
        name = "index.html" if path in ("/", "/index.html") else path.removeprefix("/static/")
        if name not in STATIC_FILES:
            return not_found()
        ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
        return Response(200, f"{ctype}; charset=utf-8", _static(name))

    @property
    def port(self) -> int:
        return self._endpoint.port

    @property
    def url(self) -> str:
        return f"http://{self._endpoint.host}:{self.port}/"

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
        self._endpoint.close()
        self._scraper.join(timeout=10)

    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
