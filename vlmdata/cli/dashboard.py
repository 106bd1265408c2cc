"""`vlmdata dashboard`: serve a live throughput page scraped from metrics endpoints."""
from __future__ import annotations

import argparse
import threading

from vlmdata.dashboard.server import Dashboard, DashboardConfig


def parse_targets(values: list[str]) -> list[str]:
    """`--targets` values (repeatable, each comma-separated) as one list of targets."""
    return [t.strip() for v in values for t in v.split(",") if t.strip()]


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "dashboard", help="live throughput dashboard over the daemon's and ranks' metrics endpoints",
        description="Scrape Prometheus endpoints (the cache daemon, each training rank) and serve a "
                    "local page with live charts: images/s, tokens/s, padding fraction, data-wait "
                    "fraction per rank, cache hit rate per tier, bytes from the object store.")
    p.add_argument("--targets", action="append", required=True, metavar="URL[,URL...]",
                   help="metrics endpoints (host:port or URL; /metrics is added when no path); repeatable")
    p.add_argument("--port", type=int, default=8080, help="port of the page (0: any free port; default 8080)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between scrapes (default 2)")
    p.add_argument("--history", type=int, default=600, help="points kept per chart (default 600)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = DashboardConfig(targets=parse_targets(args.targets), port=args.port, host=args.host,
                             interval=args.interval, history=args.history)
    try:
        dash = Dashboard(config)
    except ValueError as exc:   # a bad target or setting: say what to change, no traceback
        raise SystemExit(f"vlmdata dashboard: {exc}") from None
    print(f"dashboard at {dash.url} scraping {', '.join(t.url for t in dash.tracker.targets)}", flush=True)
    try:
        threading.Event().wait()
    finally:
        dash.close()
    return 0
