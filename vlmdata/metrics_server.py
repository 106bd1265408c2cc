"""Serving a MetricSet over HTTP, and measuring a training loop's data wait.

    metrics = MetricSet()
    with MetricsServer(metrics.registry, port=9400) as server:   # port 0: any free port
        print(server.url)                                         # http://127.0.0.1:9400/metrics
        for batch in instrument(loader, metrics, rank=0):
            train_step(batch)

`instrument` (or `LoaderMetrics`) absorbs each batch's `stats` (the counts the
DataLoader workers attached, see metrics.StatsDelta) and measures, per rank:

- data-wait seconds: time blocked inside `next()` on the loader;
- step seconds: from asking for batch i to asking for batch i+1, i.e. the
  data wait of step i plus the work done on batch i. So the data-wait
  fraction of a rank is rate(data_wait_seconds) / rate(step_seconds), in [0, 1].
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from vlmdata.metrics import MetricSet, StatsDelta

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
HOST_ENV = "VLMDATA_METRICS_HOST"  # containers set it to 0.0.0.0 so Prometheus can scrape


def default_host() -> str:
    """The bind address when none is given: $VLMDATA_METRICS_HOST, else 127.0.0.1."""
    return os.environ.get(HOST_ENV) or DEFAULT_HOST


def _handler_for(registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    class MetricsHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?", 1)[0]
            if path in ("/metrics", "/metrics/"):
                body, ctype, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
            elif path in ("/", "/healthz"):
                body, ctype, code = b"ok: metrics at /metrics\n", "text/plain; charset=utf-8", 200
            else:
                body, ctype, code = b"not found\n", "text/plain; charset=utf-8", 404
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
            log.debug("metrics http: " + format, *args)

    return MetricsHandler


class MetricsServer:
    """Serves a registry's metrics at http://HOST:PORT/metrics from a daemon thread.

    `port=0` binds any free port; `.port` and `.url` report what was bound.
    Binds 127.0.0.1 unless told otherwise: `host=`, or $VLMDATA_METRICS_HOST
    (the docker compose file sets it to 0.0.0.0 in the daemon and trainer containers).
    """

    def __init__(self, registry: CollectorRegistry | MetricSet, port: int = 0, host: str | None = None):
        host = host or default_host()
        if isinstance(registry, MetricSet):
            registry = registry.registry
        self._httpd = ThreadingHTTPServer((host, port), _handler_for(registry))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="vlmdata-metrics-http", daemon=True)
        self._thread.start()
        log.info("serving metrics at %s", self.url)

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)  # a dialable address
        host = host if ":" not in host else f"[{host}]"
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve_metrics(metrics: MetricSet | CollectorRegistry, port: int = 0, host: str | None = None) -> MetricsServer:
    """Start serving `metrics` over HTTP; returns the running server (call `.close()` to stop)."""
    return MetricsServer(metrics, port=port, host=host)


class LoaderMetrics:
    """Wraps any iterable of batches: absorbs `batch["stats"]`, times data wait and steps.

    Iterate it like the loader. Works with any training loop: the time between two
    `next()` calls is the step. `clock` is injectable for tests.
    """

    def __init__(self, loader: Iterable, metrics: MetricSet, rank: int | str = 0,
                 clock: Callable[[], float] = time.perf_counter):
        self.loader = loader
        self.metrics = metrics
        self.rank = str(rank)
        self.clock = clock

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator:
        it: Iterator | None = None
        step_start: float | None = None
        try:
            while True:
                asked = self.clock()
                if step_start is not None:
                    self.metrics.observe_step(asked - step_start, self.rank)
                step_start = asked
                try:
                    if it is None:  # starting the loader (spawning workers) is data wait too
                        it = iter(self.loader)
                    batch = next(it)
                except StopIteration:
                    step_start = None  # nothing delivered: neither a step nor a wait to count
                    return
                self.metrics.observe_wait(self.clock() - asked, self.rank)
                self._absorb(batch)
                yield batch
        finally:
            if step_start is not None:  # the consumer stopped early: its last step ends now
                self.metrics.observe_step(self.clock() - step_start, self.rank)

    def _absorb(self, batch) -> None:
        stats = batch.get("stats") if isinstance(batch, dict) else None
        if stats is None:
            return
        self.metrics.absorb(stats if isinstance(stats, StatsDelta) else StatsDelta.from_dict(stats), self.rank)


def instrument(loader: Iterable, metrics: MetricSet, rank: int | str = 0) -> LoaderMetrics:
    """`for batch in instrument(loader, metrics, rank): ...` (see LoaderMetrics)."""
    return LoaderMetrics(loader, metrics, rank)
