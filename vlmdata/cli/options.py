"""Pieces shared by the subcommands: parsing --storage-options and a progress bar on a terminal."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable


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
