"""Benchmark reports: written where `--out` says, folders made as needed."""
from __future__ import annotations

from pathlib import Path

__all__ = ["write_report"]


def write_report(text: str, path: str | None) -> None:
    """Write a benchmark's report to `path` (nothing when None) and say where it went."""
    if not path:
        return
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text.rstrip("\n") + "\n")
    print(f"written to {path}")
