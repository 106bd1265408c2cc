"""Which family a model folder belongs to, and loading it (cached per process)."""
from __future__ import annotations

import functools
import os

from vlmdata.errors import ConfigError
from vlmdata.text.families.base import ModelFamily
from vlmdata.text.families.gemma3 import Gemma3Family
from vlmdata.text.families.generic import GenericFamily
from vlmdata.text.families.idefics3 import Idefics3Family, SmolVLMFamily
from vlmdata.text.families.internvl import InternVLFamily
from vlmdata.text.families.llava import LlavaFamily
from vlmdata.text.families.llava_onevision import LlavaOnevisionFamily
from vlmdata.text.families.qwen2_vl import Qwen2VLFamily, Qwen3VLFamily, Qwen25VLFamily
from vlmdata.text.model_folder import ModelFolder

__all__ = ["FAMILIES", "family_names", "load_family"]

# Tried in order; a new family (LLaVA-NeXT anyres, InternVL tiles, Idefics) is a ModelFamily subclass added here.
FAMILIES: tuple[type[ModelFamily], ...] = (Qwen3VLFamily, Qwen25VLFamily, Qwen2VLFamily, LlavaFamily,
                                           Gemma3Family, InternVLFamily, Idefics3Family, SmolVLMFamily,
                                           LlavaOnevisionFamily,
                                           GenericFamily)   # GenericFamily last: after every native family


def family_names() -> str:
    return ", ".join(f.name for f in FAMILIES)


def _stamp(path: str) -> tuple:
    return tuple((n, os.stat(os.path.join(path, n)).st_mtime_ns) for n in sorted(os.listdir(path)))


def _said(folder: ModelFolder) -> str:
    """What the folder says about its model, for error messages ("" when it says nothing)."""
    names = {"model_type": "config.json model_type", "processor_class": "processor_class",
             "image_processor_type": "image_processor_type"}
    return ", ".join(f"{names[k]} {v!r}" for k, v in folder.hints().items() if v)


def _forced(folder: ModelFolder, family: str) -> type[ModelFamily]:
    """The family named by `family`; ConfigError when unknown or when the folder names another model."""
    chosen = next((f for f in FAMILIES if f.name == family), None)
    if chosen is None:
        raise ConfigError(f"unknown model family {family!r}; vlmdata knows {family_names()}")
    h = folder.hints()
    if (h["model_type"] is not None or h["processor_class"] is not None) and not chosen.matches(folder):
        detected = next((f.name for f in FAMILIES if f.matches(folder)), None)
        which = f"the {detected} family" if detected else "no family vlmdata knows"
        raise ConfigError(f"--family {family} contradicts {folder.path}: it says {_said(folder)}, which is "
                          f"{which}; drop --family to use the folder's own, or pass the {family} model's folder")
    return chosen


def _undetected(folder: ModelFolder) -> ConfigError:
    said = _said(folder)
    if folder.hints()["model_type"] is not None:
        types = ", ".join(t for f in FAMILIES for t in f.model_types)
        return ConfigError(f"vlmdata has no model family for {folder.path} ({said}): it knows {family_names()} "
                           f"(model_type {types}); a new kind of model needs its own ModelFamily "
                           "(vlmdata.text.families)")
    said = said or "it has no config.json and no processor config"
    return ConfigError(f"cannot tell the model family of {folder.path} ({said}); vlmdata knows {family_names()}: "
                       "pass the model's processor folder (with config.json or preprocessor_config.json), or "
                       "--family NAME")


@functools.lru_cache(maxsize=8)
def _load(path: str, stamp: tuple, train_on: str, family: str | None) -> ModelFamily:
    folder = ModelFolder.load(path)
    if family is not None:
        return _forced(folder, family)(folder, train_on)
    for cls in FAMILIES:
        if cls.matches(folder):
            return cls(folder, train_on)
    raise _undetected(folder)


def load_family(path: str, train_on: str = "assistant", family: str | None = None) -> ModelFamily:
    """The model family of a Hugging Face model folder (`family` forces one by name)."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isdir(path):
        raise ConfigError(f"model folder {path} does not exist")
    return _load(path, _stamp(path), train_on, family)
