"""Which family a model folder belongs to, and loading it (cached per process)."""
from __future__ import annotations

import functools
import os

from vlmdata.errors import ConfigError
from vlmdata.text.families.base import ModelFamily
from vlmdata.text.families.llava import LlavaFamily
from vlmdata.text.families.qwen2_vl import Qwen2VLFamily, Qwen25VLFamily
from vlmdata.text.model_folder import ModelFolder

__all__ = ["FAMILIES", "family_names", "load_family"]

# Tried in order; a new family (LLaVA-NeXT anyres, InternVL tiles, Idefics) is a ModelFamily subclass added here.
FAMILIES: tuple[type[ModelFamily], ...] = (Qwen25VLFamily, Qwen2VLFamily, LlavaFamily)


def family_names() -> str:
    return ", ".join(f.name for f in FAMILIES)


def _stamp(path: str) -> tuple:
    return tuple((n, os.stat(os.path.join(path, n)).st_mtime_ns) for n in sorted(os.listdir(path)))


@functools.lru_cache(maxsize=8)
def _load(path: str, stamp: tuple, train_on: str, family: str | None) -> ModelFamily:
    folder = ModelFolder.load(path)
    if family is not None:
        chosen = next((f for f in FAMILIES if f.name == family), None)
        if chosen is None:
            raise ConfigError(f"unknown model family {family!r}; vlmdata knows {family_names()}")
        return chosen(folder, train_on)
    for cls in FAMILIES:
        if cls.matches(folder):
            return cls(folder, train_on)
    hints = ", ".join(f"{k}={v}" for k, v in folder.hints().items() if v) or "no config.json / processor config"
    raise ConfigError(f"cannot tell the model family of {path} ({hints}); vlmdata knows {family_names()}: "
                      "pass the model's processor folder (with config.json or preprocessor_config.json)")


def load_family(path: str, train_on: str = "assistant", family: str | None = None) -> ModelFamily:
    """The model family of a Hugging Face model folder (`family` forces one by name)."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isdir(path):
        raise ConfigError(f"model folder {path} does not exist")
    return _load(path, _stamp(path), train_on, family)
