"""Pieces shared by the subcommands: parsing --storage-options, a progress bar on a terminal, running a job."""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from vlmdata.errors import ConfigError

__all__ = ["parse_storage_options", "progress_bar", "run_with_progress", "skipped_summary"]

T = TypeVar("T")


def parse_storage_options(text: str | None) -> dict:
    """fsspec options from a JSON object, or from a file with `@path`; ValueError says what is wrong."""
    if not text:
        return {}
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    try:
        opts = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--storage-options is not valid JSON: {exc}") from None
    if not isinstance(opts, dict):
        raise ValueError("--storage-options must be a JSON object")
    return opts


def progress_bar() -> tuple[object | None, Callable[[int, int], None] | None]:
    """(tqdm bar, update(rows, written)) when stderr is a terminal, else (None, None)."""
    if not sys.stderr.isatty():
        return None, None
    from tqdm import tqdm

    bar = tqdm(unit=" samples", unit_scale=True, file=sys.stderr, dynamic_ncols=True)

    def update(rows: int, written: int) -> None:
        bar.update(rows)

    return bar, update


def run_with_progress(work: Callable[[Callable[[int, int], None] | None], T]) -> tuple[T | None, float]:
    """(result, seconds) of `work(update)` under a progress bar; a ConfigError is printed, giving None."""
    bar, update = progress_bar()
    t0 = time.perf_counter()
    try:
        return work(update), time.perf_counter() - t0
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None, time.perf_counter() - t0
    finally:
        if bar is not None:
            bar.close()


def skipped_summary(stats: dict) -> str:
    """'N (reason=n, ...)' for a manifest's stats."""
    reasons = ", ".join(f"{k}={v}" for k, v in stats["skipped"].items()) or "none"
    return f"{stats['skipped_total']} ({reasons})"
