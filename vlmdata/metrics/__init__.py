"""Metrics: counts that travel with packs (`counts`, no prometheus_client), the Prometheus registry, its HTTP server, and `instrument`."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "StatsDelta": "counts", "take_fetch_stats": "counts",
    "LoaderMetrics": "loader_metrics", "instrument": "loader_metrics",
    "MetricSet": "registry", "exported_series": "registry",
    "MetricsServer": "server", "serve_metrics": "server",
})
