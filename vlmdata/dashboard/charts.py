"""What the web dashboard shows: each chart as a small declarative spec over vlmdata metrics.

A line's value at a scrape is either a rate (increase of the `num` counters per
second) or, when `den` is given, a ratio of increases (num / den over the same
interval). `by` splits a line per value of a label (one line per rank or tier);
`where` filters samples by label values.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Line:
    """One plotted quantity (see module docstring)."""

    name: str
    num: tuple[str, ...]
    den: tuple[str, ...] = ()
    where: tuple[tuple[str, str], ...] = ()
    by: str | None = None

    @property
    def is_ratio(self) -> bool:
        return bool(self.den)

    def metric_names(self) -> set[str]:
        return set(self.num) | set(self.den)


@dataclass(frozen=True)
class Chart:
    """A chart: an id (used in the page's DOM), a title, a unit and its lines."""

    id: str
    title: str
    unit: str
    lines: tuple[Line, ...] = field(default_factory=tuple)

    def metric_names(self) -> set[str]:
        return set().union(*(line.metric_names() for line in self.lines))

    def label_names(self) -> set[str]:
        names = {k for line in self.lines for k, _ in line.where}
        return names | {line.by for line in self.lines if line.by}


CHARTS: tuple[Chart, ...] = (
    Chart("images_per_second", "Images / s", "1/s",
          (Line("images", ("vlmdata_images_total",)),)),
    Chart("tokens_per_second", "Tokens / s", "1/s",
          (Line("real", ("vlmdata_real_tokens_total",)),
           Line("padding", ("vlmdata_padding_tokens_total",)))),
    Chart("padding_fraction", "Padding fraction", "fraction",
          (Line("padding", ("vlmdata_padding_tokens_total",),
                ("vlmdata_padding_tokens_total", "vlmdata_real_tokens_total")),)),
    Chart("data_wait_fraction", "Data-wait fraction per rank", "fraction",
          (Line("rank", ("vlmdata_data_wait_seconds_total",), ("vlmdata_step_seconds_total",), by="rank"),)),
    Chart("cache_hit_rate", "Cache hit rate per tier", "fraction",
          (Line("tier", ("vlmdata_cache_hits_total",), ("vlmdata_cache_hits_total", "vlmdata_cache_misses_total"),
                by="tier"),)),
    Chart("object_store_bytes", "Bytes / s from the object store", "B/s",
          (Line("remote", ("vlmdata_fetch_bytes_total",), where=(("tier", "remote"),)),)),
)
