"""`vlmdata dashboard`: a local web page with live charts scraped from metrics endpoints."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "CHARTS": "charts", "Chart": "charts", "Line": "charts",
    "RateTracker": "scrape", "chart_values": "scrape", "normalize_target": "scrape",
    "parse_counters": "scrape",
    "Dashboard": "server", "DashboardConfig": "server",
})
