"""Pieces shared by the subcommands: parsing --storage-options, a progress bar on a terminal, running a job,
and the exit codes scripts can test:

    0  done (a warning line on stderr from 1 % skipped)
    2  a usage or configuration error (nothing written; also: no row found, or every row skipped)
    3  done and written, but more than --max-skip-fraction skipped; the last line names the top
       reasons with an example each
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from vlmdata.errors import ConfigError, TooManySkipsError
from vlmdata.ingest.lengths import LengthReport
from vlmdata.ingest.skips import DEFAULT_MAX_SKIP_FRACTION, check_skip_fraction

__all__ = ["EXIT_TOO_MANY_SKIPS", "EXIT_USAGE", "add_max_skip_fraction", "parse_storage_options", "print_lengths",
           "progress_bar", "run_reported", "run_with_progress", "skipped_summary"]

EXIT_USAGE = 2
EXIT_TOO_MANY_SKIPS = 3

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


def _skip_fraction(text: str) -> float:
    try:
        return check_skip_fraction(float(text))
    except (ValueError, ConfigError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_max_skip_fraction(parser: argparse.ArgumentParser, unit: str) -> None:
    """The --max-skip-fraction option (shard, index, retokenize)."""
    parser.add_argument("--max-skip-fraction", type=_skip_fraction, default=DEFAULT_MAX_SKIP_FRACTION,
                        metavar="F",
                        help=f"exit with code {EXIT_TOO_MANY_SKIPS} (after writing everything it could) when more "
                             f"than this fraction of the {unit} is skipped (default {DEFAULT_MAX_SKIP_FRACTION:g}; "
                             "1 disables); a warning from 1 %%")


def run_reported(work: Callable[[Callable[[int, int], None] | None], T],
                 report: Callable[[T, float], None]) -> int:
    """Run `work(update)` under a progress bar, print its summary with `report(result, seconds)`; the exit
    code (see the module docstring). Too many skips: the summary, then the reasons as the last line."""
    t0 = time.perf_counter()
    try:
        result, dt = run_with_progress(work)
    except TooManySkipsError as exc:
        report(exc.result, time.perf_counter() - t0)
        sys.stdout.flush()
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_TOO_MANY_SKIPS
    if result is None:
        return EXIT_USAGE
    report(result, dt)
    return 0


def print_lengths(manifest) -> None:
    """The written dataset's sample lengths against common budgets, one line (from its stats)."""
    lengths = manifest.stats.get("lengths")
    if lengths:
        print(f"lengths: {LengthReport.from_stats(lengths, manifest.num_samples).summary()} "
              f"(text + image + video tokens; `vlmdata inspect DATASET --max-tokens N` for a budget)")
