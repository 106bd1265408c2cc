"""Scraping Prometheus text endpoints and turning counters into chart points.

`parse_counters` reads one exposition (prometheus_client's parser); `RateTracker`
keeps the previous scrape of each target and turns two scrapes into per-line
values for every chart in `charts.CHARTS` (counter resets are handled the way
Prometheus does: a drop means the counter restarted from zero).

Every target is scraped at once, each in its own thread and under its own deadline (`timeout`
for the whole response, not only per socket read: a target sending a byte every two seconds
would otherwise never time out), so a slow or stuck target costs only its own data, after at
most twice its timeout, and every other target is scraped on time.
"""
from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict, deque
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from vlmdata.dashboard.charts import CHARTS, Chart, Line

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]


SCHEMES = ("http", "https")
MAX_EXPOSITION_BYTES = 32 << 20   # a metrics page larger than this is not an exposition


def normalize_target(target: str) -> str:
    """`host:port`, `http://host:port` or a full http(s) URL -> the URL of its /metrics.

    Only http and https are scraped: a `file://` (or any other scheme) target would let the dashboard
    show a local file's contents in `/api/data`, so it is refused with a ValueError.
    """
    target = target.strip()
    if not target:
        raise ValueError("empty scrape target")
    if "://" not in target:
        target = "http://" + target
    if target.split("://", 1)[0].lower() not in SCHEMES:
        raise ValueError(f"scrape target {target!r}: only http:// and https:// metrics endpoints can be scraped "
                         "(give host:port or an http(s) URL)")
    if "/" not in target.split("://", 1)[1].rstrip("/"):
        return target.rstrip("/") + "/metrics"
    return target


def parse_counters(text: str) -> Samples:
    """Every sample of an exposition as {(name, sorted labels): value} (`_created` dropped)."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def _http_only_opener() -> urllib.request.OpenerDirector:
    """An opener that speaks http(s) only (no file:, ftp: or data: handlers, so no redirect can reach them)."""
    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.HTTPHandler(), urllib.request.HTTPSHandler(),
                    urllib.request.HTTPRedirectHandler(), urllib.request.HTTPDefaultErrorHandler(),
                    urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener


_OPENER = _http_only_opener()


def fetch_metrics(url: str, timeout: float = 5.0) -> str:
    """GET an http(s) metrics endpoint; raises OSError (URLError, TimeoutError included) when it is down, not
    http(s), or has not sent its whole page `timeout` seconds after the request (checked after each read, each
    of which waits at most `timeout`: so at most twice that in all)."""
    if url.split("://", 1)[0].lower() not in SCHEMES:
        raise ValueError(f"not an http(s) URL: {url!r}")
    deadline = time.monotonic() + timeout
    chunks, size = [], 0
    with _OPENER.open(url, timeout=timeout) as resp:
        while size <= MAX_EXPOSITION_BYTES:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{url}: no whole response within {timeout:g}s")
            chunk = resp.read1(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    if size > MAX_EXPOSITION_BYTES:
        raise ValueError(f"{url}: more than {MAX_EXPOSITION_BYTES} bytes: not a metrics page")
    return b"".join(chunks).decode("utf-8")


def _increase(prev: float | None, cur: float) -> float:
    """Counter increase between two scrapes of a target.

    A series absent from the previous scrape was created since (labelled
    children appear lazily at 0); a drop means the counter restarted from 0.
    """
    if prev is None:
        return cur
    return cur - prev if cur >= prev else cur


def _matches(labels: Labels, where: tuple[tuple[str, str], ...]) -> bool:
    d = dict(labels)
    return all(d.get(k) == v for k, v in where)


@dataclass
class TargetState:
    """The last scrape of one target and how scraping it went."""

    url: str
    samples: Samples | None = None
    at: float | None = None
    up: bool = False
    scrapes: int = 0
    errors: int = 0
    last_error: str = ""

    def status(self) -> dict:
        return {"url": self.url, "up": self.up, "scrapes": self.scrapes, "errors": self.errors,
                "last_error": self.last_error}


@dataclass
class Increments:
    """Counter increases of one interval, summed over targets: per line key -> (num, den, seconds)."""

    num: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    den: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    rate: dict[str, float] = field(default_factory=lambda: defaultdict(float))


def _line_key(line: Line, labels: Labels) -> str | None:
    if line.by is None:
        return line.name
    value = dict(labels).get(line.by)
    return None if value is None else f"{line.by} {value}"


def _accumulate(chart: Chart, prev: Samples, cur: Samples, seconds: float, acc: Increments) -> None:
    for line in chart.lines:
        for (name, labels), value in cur.items():
            if (name not in line.num and name not in line.den) or not _matches(labels, line.where):
                continue
            key = _line_key(line, labels)
            if key is None:
                continue
            inc = _increase(prev.get((name, labels)), value)
            if name in line.num:
                acc.num[key] += inc
                acc.rate[key] += inc / seconds
            if name in line.den:
                acc.den[key] += inc
            acc.num.setdefault(key, 0.0)


def chart_values(chart: Chart, pairs: Iterable[tuple[Samples, Samples, float]]) -> dict[str, float | None]:
    """One point per line of `chart` from (previous, current, seconds) scrapes of each target."""
    acc = Increments()
    for prev, cur, seconds in pairs:
        if seconds > 0:
            _accumulate(chart, prev, cur, seconds, acc)
    ratio = chart.lines and all(line.is_ratio for line in chart.lines)
    out: dict[str, float | None] = {}
    for key in acc.num:
        if ratio:
            den = acc.den.get(key, 0.0)
            out[key] = acc.num[key] / den if den > 0 else None
        else:
            out[key] = acc.rate.get(key, 0.0)
    return out


class RateTracker:
    """Scrapes targets and keeps a bounded history of chart points."""

    def __init__(self, targets: list[str], charts: tuple[Chart, ...] = CHARTS, history: int = 600,
                 timeout: float = 5.0):
        if not targets:
            raise ValueError("no scrape targets: pass --targets URL[,URL...]")
        self.targets = [TargetState(normalize_target(t)) for t in targets]
        self.charts = charts
        self.timeout = timeout
        self.points: deque = deque(maxlen=history)
        self._lock = threading.Lock()

    def _scrape(self, t: TargetState) -> tuple[TargetState, Samples | None, str, float]:
        try:
            return t, parse_counters(fetch_metrics(t.url, self.timeout)), "", time.monotonic()
        except (OSError, ValueError) as exc:  # down, refused, timed out, or not an exposition
            return t, None, f"{type(exc).__name__}: {exc}", time.monotonic()

    def scrape_once(self) -> dict:
        """Scrape every target once, all at once; append and return the new point (chart id -> line -> value)."""
        # network I/O outside the lock, so the page never waits on a slow target; one thread per target
        with ThreadPoolExecutor(min(len(self.targets), 64), thread_name_prefix="scrape") as pool:
            fetched = list(pool.map(self._scrape, self.targets))
        with self._lock:
            pairs = []
            for t, cur, error, at in fetched:
                if cur is None:
                    t.up, t.errors, t.last_error = False, t.errors + 1, error
                    continue
                if t.samples is not None and t.at is not None:
                    pairs.append((t.samples, cur, at - t.at))
                t.samples, t.at, t.up, t.scrapes = cur, at, True, t.scrapes + 1
            if not pairs:
                return {}
            point = {"t": time.time(), "charts": {c.id: chart_values(c, pairs) for c in self.charts}}
            self.points.append(point)
            return point

    def snapshot(self) -> dict:
        """What the page draws: chart specs, their series ([t, value] pairs) and target status."""
        with self._lock:
            points = list(self.points)
            targets = [t.status() for t in self.targets]
        charts = []
        for c in self.charts:
            series: dict[str, list] = {}
            for p in points:
                for key, value in p["charts"].get(c.id, {}).items():
                    series.setdefault(key, []).append([p["t"], value])
            charts.append({"id": c.id, "title": c.title, "unit": c.unit, "series": series})
        return {"charts": charts, "targets": targets, "points": len(points)}
