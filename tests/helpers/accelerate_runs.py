"""Launched by `accelerate launch` (tests/hf/test_accelerate_families.py): runs `vlmdata_pipelines.hf_trainer`
once for each run of a JSON plan ([{"data", "model", "out"}, ...]) in the same process group, so one launch
trains every family's tiny model without paying the start-up of a process group per family."""
from __future__ import annotations

import json
import sys

from vlmdata_pipelines.hf_trainer import close_process_group, main


def run_plan(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        runs = json.load(f)
    for run in runs:
        code = main(["--data", run["data"], "--model", run["model"], "--out", run["out"], "--epochs", "1",
                     "--max-tokens", str(run["max_tokens"]), "--num-workers", "0"])
        if code:
            return code
    return 0


if __name__ == "__main__":
    try:
        code = run_plan(sys.argv[1])
    finally:
        close_process_group()
    sys.exit(code)
