"""Lazy package exports (PEP 562): a package names its public API without importing it.

    __all__, __getattr__, __dir__ = lazy_exports(__name__, {"VLMDataset": "loading.dataset", ...})

Each name is imported from its module (relative to the package) on first
access, so `import vlmdata` or `import vlmdata.formats` in a sharding worker
does not pay for torch, and a DataLoader worker never imports prometheus_client.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[list[str], Callable, Callable]:
    """(`__all__`, `__getattr__`, `__dir__`) for `package`, whose names live in the given submodules."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return sorted(exports), __getattr__, __dir__
