"""Raw corpora for the tests: the generator (vlmdata.testing.raw_corpus unless VLMDATA_GEN_RAW), run."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from vlmdata.testing import generator_script


def gen_raw_path() -> Path:
    """The generator script (vlmdata/testing/raw_corpus.py; VLMDATA_GEN_RAW overrides)."""
    return Path(generator_script())


def generate_corpus(out: Path, samples: int, seed: int = 0, fmt: str = "llava", corrupt: float = 0.0) -> Path:
    """Run the generator into `out` and return it."""
    cmd = [sys.executable, str(gen_raw_path()), str(out), "--samples", str(samples), "--seed", str(seed),
           "--format", fmt, "--corrupt", str(corrupt)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out
