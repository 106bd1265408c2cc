"""Headless Chromium for the dashboard test, and reading the DOM it dumps."""
from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--hide-scrollbars",
                  "--disable-dev-shm-usage", "--mute-audio")


def chromium() -> str:
    """Debian's chromium; a missing browser fails the test (it is a requirement, not an option)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium not found: the dashboard browser test needs Debian's chromium "
                    "(`apt-get install -y chromium`; tools/run_tests.sh installs it when run as root)")
    return path


def run_chromium(url: str, profile: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


class ElementIndex(HTMLParser):
    """Attributes of every element with an id or a data-chart attribute, from a DOM dump."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, dict] = {}
        self.charts: dict[str, dict] = {}
        self.body: dict = {}

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = {k: (v or "") for k, v in attrs}
        if tag == "body":
            self.body = a
        if "id" in a:
            self.by_id[a["id"]] = a
        if "data-chart" in a:
            self.charts[a["data-chart"]] = a


def parse_dom(html: str) -> ElementIndex:
    idx = ElementIndex()
    idx.feed(html)
    return idx
