"""Where the checkout is: the one definition of the repository root for every test."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
