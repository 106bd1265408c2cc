"""Serving a MetricSet's registry over HTTP at /metrics.

    metrics = MetricSet()
    with serve_metrics(metrics, port=9400) as server:   # port 0: any free port
        print(server.url)                              # http://127.0.0.1:9400/metrics
"""
from __future__ import annotations

import logging
import os

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from vlmdata.http_endpoint import TEXT, HttpEndpoint, Response, not_found
from vlmdata.metrics.registry import MetricSet

__all__ = ["MetricsServer", "default_host", "serve_metrics"]

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
HOST_ENV = "VLMDATA_METRICS_HOST"  # containers set it to 0.0.0.0 so Prometheus can scrape


def default_host() -> str:
    """The bind address when none is given: $VLMDATA_METRICS_HOST, else 127.0.0.1."""
    return os.environ.get(HOST_ENV) or DEFAULT_HOST


class MetricsServer:
    """Serves a registry's metrics at http://HOST:PORT/metrics from a daemon thread.

    `port=0` binds any free port; `.port` and `.url` report what was bound.
    Binds 127.0.0.1 unless told otherwise: `host=`, or $VLMDATA_METRICS_HOST
    (the docker compose file sets it to 0.0.0.0 in the daemon and trainer containers).
    """

    def __init__(self, registry: CollectorRegistry | MetricSet, port: int = 0, host: str | None = None):
        if isinstance(registry, MetricSet):
            registry = registry.registry
        self._registry = registry
        self._endpoint = HttpEndpoint(self._respond, host or default_host(), port, "metrics")
        log.info("serving metrics at %s", self.url)

    def _respond(self, path: str) -> Response:
        if path in ("/metrics", "/metrics/"):
            return Response(200, CONTENT_TYPE_LATEST, generate_latest(self._registry))
        if path in ("/", "/healthz"):
            return Response(200, TEXT, b"ok: metrics at /metrics\n")
        return not_found()

    @property
    def host(self) -> str:
        return self._endpoint.host

    @property
    def port(self) -> int:
        return self._endpoint.port

    @property
    def url(self) -> str:
        return self._endpoint.url("/metrics")

    def close(self) -> None:
        self._endpoint.close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve_metrics(metrics: MetricSet | CollectorRegistry, port: int = 0, host: str | None = None) -> MetricsServer:
    """Start serving `metrics` over HTTP; returns the running server (call `.close()` to stop)."""
    return MetricsServer(metrics, port=port, host=host)
