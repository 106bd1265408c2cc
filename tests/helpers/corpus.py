"""gen_raw corpora: where the generator lives, and running it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from vlmdata.testing import require_gen_raw


def gen_raw_path() -> Path:
    """../shared/bench/gen_raw.py next to the checkout (VLMDATA_GEN_RAW overrides)."""
    return Path(require_gen_raw())


def generate_corpus(out: Path, samples: int, seed: int = 0, fmt: str = "llava", corrupt: float = 0.0) -> Path:
    """Run gen_raw.py into `out` and return it."""
    cmd = [sys.executable, str(gen_raw_path()), str(out), "--samples", str(samples), "--seed", str(seed),
           "--format", fmt, "--corrupt", str(corrupt)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out
