"""The wheel `pip install` gets: only `vlmdata` and `vlmdata_pipelines` at the top level (no `tests`, no
`tools`), the dashboard's static files, no module that shadows a standard-library name, and entry points
that resolve from the wheel's own metadata (`vlmdata`, `vlmdata demo`)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import Distribution
from pathlib import Path, PurePosixPath

import pytest

from tests.helpers.paths import REPO

TOP_LEVEL = {"vlmdata", "vlmdata_pipelines"}
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "site", "dist", "*.egg-info", "__pycache__",
                                    ".pytest_cache")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built offline (no index, the venv's setuptools) from a copy of the whole checkout,
    tests/ and tools/ included, so that leaving them out is the build's doing."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE, symlinks=True)
    cmd = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "--no-index",
           "--disable-pip-version-check", "-q", "-w", str(root / "dist")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = (root / "dist").glob("vlmdata-*.whl")
    return built


@pytest.fixture(scope="module")
def unpacked(wheel, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("unpacked")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(out)
    return out


def wheel_names(wheel: Path) -> list[PurePosixPath]:
    with zipfile.ZipFile(wheel) as z:
        return [PurePosixPath(n) for n in z.namelist()]


def top_level_names(names: list[PurePosixPath]) -> set[str]:
    return {n.parts[0] for n in names if not n.parts[0].endswith((".dist-info", ".data"))}


def stdlib_shadows(names: list[PurePosixPath]) -> list[str]:
    """Modules or packages of the wheel whose name (at any depth) is a standard-library module's: at the top
    level they would replace it on import; deeper, a script run from their folder would."""
    found = []
    for n in names:
        if n.parts[0].endswith(".dist-info") or n.suffix not in {".py", ".so", ".pyd"}:
            continue
        module = n.with_suffix("")
        parts = module.parts[:-1] if module.name == "__init__" else module.parts
        found += [f"{n} ({part})" for part in parts if part in sys.stdlib_module_names]
    return sorted(set(found))


def test_wheel_holds_only_the_two_packages(wheel):
    names = wheel_names(wheel)
    assert top_level_names(names) == TOP_LEVEL
    dist_infos = {n.parts[0] for n in names if n.parts[0].endswith(".dist-info")}
    assert dist_infos == {"vlmdata-0.1.0.dist-info"}
    assert not [n for n in names if n.parts[0] in {"tests", "tools", "docs", "docker"}]
    sources = {p.relative_to(REPO).as_posix() for pkg in TOP_LEVEL for p in (REPO / pkg).rglob("*.py")}
    assert sources <= {str(n) for n in names}, "modules missing from the wheel"


def test_wheel_ships_the_dashboard_static_files(wheel):
    static = {f"vlmdata/dashboard/static/{p.name}" for p in (REPO / "vlmdata/dashboard/static").iterdir()}
    assert static and static <= {str(n) for n in wheel_names(wheel)}


def test_no_module_in_the_wheel_shadows_the_standard_library(wheel):
    assert stdlib_shadows(wheel_names(wheel)) == []


def test_the_shadow_check_finds_shadows():
    names = [PurePosixPath(p) for p in ("pipelines/__init__.py", "vlmdata/decode/codecs.py",
                                        "vlmdata/queue/__init__.py", "vlmdata/decode/codec_support.py")]
    assert stdlib_shadows(names) == ["vlmdata/decode/codecs.py (codecs)", "vlmdata/queue/__init__.py (queue)"]
    assert top_level_names(names) == {"pipelines", "vlmdata"}


def test_entry_points_resolve_from_the_wheel_metadata(unpacked):
    (info,) = unpacked.glob("vlmdata-*.dist-info")
    eps = Distribution.at(info).entry_points
    assert {(e.group, e.name, e.value) for e in eps} >= {
        ("console_scripts", "vlmdata", "vlmdata.cli:main"),
        ("vlmdata.commands", "demo", "vlmdata_pipelines.demo_command:register")}
    # Only the unpacked wheel on the path (ahead of the venv's own install): the CLI finds `demo` through the
    # wheel's metadata and imports it from the wheel.
    probe = ("import sys, vlmdata, vlmdata_pipelines.demo_command as d; from vlmdata.cli import main; "
             "print(vlmdata.__file__); print(d.__file__); sys.argv = ['vlmdata', 'demo', '--help']; main()")
    env = dict(os.environ, PYTHONPATH=str(unpacked))
    done = subprocess.run([sys.executable, "-c", probe], cwd=unpacked.parent, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = done.stdout.splitlines()[:2]
    assert Path(first).is_relative_to(unpacked) and Path(second).is_relative_to(unpacked)
    assert "usage: vlmdata demo" in done.stdout
