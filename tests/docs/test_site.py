"""The documentation site builds with `mkdocs build --strict`, and strict means strict: a broken link, a
missing anchor or a page left out of the navigation fails it. README.md's links resolve, and its test
command is what CI runs."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.markdown import code_blocks, heading_span
from tests.helpers.paths import REPO


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(site)], capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture
def site_copy(tmp_path) -> Path:
    """mkdocs.yml and docs/ copied (links followed: the record's page becomes a plain file)."""
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    return tmp_path


def test_site_builds_strict(tmp_path):
    done = build(REPO, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    pages = {p.parent.name for p in (tmp_path / "site").glob("*/index.html")}
    written = {p.stem for p in (REPO / "docs").glob("*.md")} - {"index"}
    assert written <= pages, f"pages not built: {sorted(written - pages)}"
    assert "Targets met" in (tmp_path / "site" / "benchmarks" / "index.html").read_text()


@pytest.mark.parametrize("damage, complaint", [
    (lambda docs: (docs / "scale.md").write_text((docs / "scale.md").read_text() + "\n[gone](no-such-page.md)\n"),
     "no-such-page.md"),
    (lambda docs: (docs / "scale.md").write_text((docs / "scale.md").read_text() + "\n[x](index.md#no-such-anchor)\n"),
     "no-such-anchor"),
    (lambda docs: (docs / "orphan.md").write_text("# A page nobody listed\n"), "orphan.md"),
], ids=["broken-link", "broken-anchor", "page-not-in-nav"])
def test_strict_build_fails_on(site_copy, damage, complaint):
    assert build(site_copy, site_copy / "site").returncode == 0     # the copy builds before it is damaged
    damage(site_copy / "docs")
    done = build(site_copy, site_copy / "site")
    assert done.returncode != 0 and complaint in done.stderr, done.stderr[-2000:]


def test_readme_links_resolve():
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [link.split("#")[0] for link in links if not re.match(r"[a-z]+://", link)]
    assert local, "README.md links to no page"
    assert [link for link in local if not (REPO / link).exists()] == []
    assert "docs/index.md" in local and "docs/getting-started.md" in local


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    two = heading_span(readme, "## The two commands")
    commands = [line.split("#")[0].strip() for block in code_blocks(readme) if block.line in two
                for line in block.code.splitlines()]
    assert [c for c in commands if c] == ["make demo", "make test"]
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith("#")]
    assert ci[-1] == "make test"
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^test: .*\n\tbash tools/run_tests.sh", makefile, re.M)
