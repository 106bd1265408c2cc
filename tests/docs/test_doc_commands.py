"""Every command in the documentation runs: the ```bash blocks of docs/*.md and of README.md's quick start.

Convention (docs/index.md): a page's ```bash blocks run top to bottom in ONE bash shell
(`set -euo pipefail`: no `| head`, whose writer then fails) in a fresh empty directory, with this
venv's bin first on PATH and the repository on PYTHONPATH; a page makes its own data first. Commands that cannot run here (make itself,
GPUs, multi-node jobs, docker) go in ```console or ```text blocks with a sentence saying why.
A new page under docs/ is picked up automatically. Background processes a page starts are ended with
the shell's process group.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.markdown import code_blocks, heading_span
from tests.helpers.paths import REPO

DOCS = REPO / "docs"
RUNNABLE = "bash"
MARKER = "@@doc-block {}@@"
PAGE_TIMEOUT = 300


def command_pages() -> dict[str, list]:
    """Page name -> its runnable blocks: every docs/*.md written here (not the linked-in BENCHMARKS.md
    record, whose commands are the benchmarks), and README.md's quick start."""
    pages = {}
    for path in sorted(DOCS.glob("*.md")):
        if path.is_symlink():
            continue
        blocks = [b for b in code_blocks(path.read_text(encoding="utf-8")) if b.lang == RUNNABLE]
        if blocks:
            pages[path.name] = blocks
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    quick = heading_span(readme, "## Quick start")
    pages["README.md#quick-start"] = [b for b in code_blocks(readme) if b.lang == RUNNABLE and b.line in quick]
    return pages


PAGES = command_pages()


def script(blocks) -> str:
    """One bash script: each block preceded by a marker line naming it, so a failure can be placed."""
    parts = ["set -euo pipefail\n"]
    for i, block in enumerate(blocks):
        parts.append(f"echo '{MARKER.format(i)}'\n{block.code}")
    return "\n".join(parts)


def environment(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO)
    env["VLMDATA_CACHE_DIR"] = str(workdir / ".vlmdata-cache")      # the tuner's results, not ~/.cache
    env["VLMDATA_KEYS_CACHE"] = str(workdir / ".vlmdata-keys")
    return env


def run_page(blocks) -> tuple[int, str]:
    """Run the blocks in one shell in a fresh short-named directory (Unix socket paths stay short)."""
    workdir = Path(tempfile.mkdtemp(prefix="vlmdoc-", dir="/tmp"))
    log, page_script = (workdir.parent / f"{workdir.name}.{ext}" for ext in ("log", "sh"))
    try:
        page_script.write_text(script(blocks))
        with open(log, "wb") as out:
            proc = subprocess.Popen(["bash", str(page_script)], cwd=workdir, env=environment(workdir), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                rc = proc.wait(timeout=PAGE_TIMEOUT)
            except subprocess.TimeoutExpired:
                rc = -1
            finally:
                try:                                     # the page's own background processes, if any remain
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        return rc, log.read_text(errors="replace")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        log.unlink(missing_ok=True)
        page_script.unlink(missing_ok=True)


def failure_report(page: str, blocks, rc: int, output: str) -> str:
    reached = [int(n) for n in re.findall(MARKER.format(r"(\d+)"), output)]
    block = blocks[reached[-1]] if reached else blocks[0]
    tail = output[output.rfind(MARKER.format(reached[-1])) if reached else 0:][-4000:]
    what = "timed out" if rc == -1 else f"exit status {rc}"
    return (f"{page}: the ```bash block at line {block.line} failed ({what})\n--- block ---\n{block.code}"
            f"--- output ---\n{tail}")


@pytest.mark.slow          # each page starts several Python processes: 20-60 s on a shared 2-core machine
@pytest.mark.integration   # they run the CLI, torchrun, the cache daemon and the dashboard as subprocesses
@pytest.mark.parametrize("page", list(PAGES))
def test_page_commands_run(page):
    blocks = PAGES[page]
    rc, output = run_page(blocks)
    assert rc == 0, failure_report(page, blocks, rc, output)
    assert f"{MARKER.format(len(blocks) - 1)}" in output        # every block ran


def test_a_failing_block_is_reported_with_its_page_and_line():
    blocks = code_blocks("```bash\necho one\n```\n\ntext\n\n```bash\necho two\nfalse\necho never\n```\n")
    rc, output = run_page(blocks)
    assert rc != 0 and "one" in output and "never" not in output
    report = failure_report("example.md", blocks, rc, output)
    assert "example.md: the ```bash block at line 7 failed" in report and "two" in report


def test_blocks_of_a_page_share_one_shell_in_an_empty_directory():
    blocks = code_blocks("```bash\ntest -z \"$(ls -A)\"\nX=41\ncd . && mkdir sub\n```\n```bash\n"
                         "test $((X + 1)) = 42 && test -d sub\npython -c 'import vlmdata'\n```\n")
    rc, output = run_page(blocks)
    assert rc == 0, output


def test_the_quick_start_and_the_pages_have_commands():
    assert PAGES["README.md#quick-start"], "README.md's quick start has no ```bash block"
    for name in ("getting-started.md", "input-formats.md", "loading-and-packing.md", "hf-training.md",
                 "cache-and-metrics.md", "faults-and-hostile-input.md", "scale.md"):
        assert name in PAGES, f"docs/{name} has no ```bash block"


def test_background_processes_of_a_page_end_with_it():
    rc, output = run_page(code_blocks("```bash\nsleep 600 &\necho \"started $!\"\n```\n"))
    assert rc == 0, output
    pid = int(re.search(r"started (\d+)", output).group(1))
    deadline = time.monotonic() + 30
    while running(pid) and time.monotonic() < deadline:     # SIGKILL was sent; wait until it has landed
        time.sleep(0.05)
    assert not running(pid)


def running(pid: int) -> bool:
    """Whether the process exists and is not a zombie (killed, waiting for its new parent to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
