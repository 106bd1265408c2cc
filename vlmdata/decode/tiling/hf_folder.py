"""A model folder's Hugging Face processor, loaded with transformers, for the `processor` image policy.

`folder_files(path)` names and hashes the files the processor reads (tokenizer, chat template, image
processor and model configs): the policy stores them, so a loader can tell that the folder it loads
the processor from is the one the dataset was sharded with. `load_processor(path, files)` is
`transformers.AutoProcessor.from_pretrained(path)` with a clear `ConfigError` for every way it can fail
here: no transformers, a processor that needs torchvision (only the PIL image processors run without
it), a folder without an image processor (text-only or video-only), a processor that does not expand
an image token through `replace_image_token`, a folder that is missing or changed since sharding.
"""
from __future__ import annotations

import functools
import hashlib
import os

from vlmdata.errors import ConfigError
from vlmdata.text.model_folder import MAX_TOKENIZER_BYTES, TOKENIZER_FILES, VISION_FILES, read_model_file

__all__ = ["PROCESSOR_FILES", "folder_files", "load_processor"]

PROCESSOR_FILES = TOKENIZER_FILES + VISION_FILES + ("tokenizer.model", "vocab.json", "merges.txt",
                                                    "video_preprocessor_config.json")


def folder_files(path: str) -> tuple[tuple[str, str], ...]:
    """((name, sha256), ...) of the processor files present in `path`."""
    out = []
    for name in PROCESSOR_FILES:
        data = read_model_file(path, name, MAX_TOKENIZER_BYTES)
        if data is not None:
            out.append((name, hashlib.sha256(data).hexdigest()))
    return tuple(out)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _opened(path: str):
    try:
        from transformers import AutoProcessor
    except ImportError as exc:
        raise ConfigError(f"the generic model family loads {path}'s processor with transformers, which does not "
                          f"import here: {_first_line(exc)}") from exc
    try:
        return AutoProcessor.from_pretrained(path)
    except ImportError as exc:
        needs = "torchvision" if "torchvision" in str(exc).lower() else "a library that is not installed"
        raise ConfigError(f"transformers' processor for {path} needs {needs} ({_first_line(exc)}); the generic "
                          "family runs only processors whose image processor has a PIL backend "
                          "(`*ImageProcessorPil`)") from exc
    except Exception as exc:  # transformers raises many kinds (OSError, ValueError, KeyError, AttributeError)
        raise ConfigError(f"transformers cannot load the processor of {path}: {type(exc).__name__}: "
                          f"{_first_line(exc)}") from exc


def _check_usable(path: str, proc) -> None:
    from transformers import ProcessorMixin

    name = type(proc).__name__
    if getattr(proc, "image_processor", None) is None:
        what = "a video processor only" if getattr(proc, "video_processor", None) is not None else "no image processor"
        raise ConfigError(f"{path}: transformers loads {name} for it, which has {what}; the generic family needs "
                          "an image processor (preprocessor_config.json)")
    if not isinstance(proc, ProcessorMixin) or getattr(proc, "tokenizer", None) is None:
        raise ConfigError(f"{path}: {name} is not a multimodal processor with a tokenizer")
    if not getattr(proc, "image_token", None):
        raise ConfigError(f"{path}: {name} has no image_token, so there is no image marker to expand")
    if type(proc).replace_image_token is ProcessorMixin.replace_image_token:
        raise ConfigError(f"{path}: {name} does not expand its image token through replace_image_token (it "
                          "lays out text its own way), which the generic family needs")


@functools.lru_cache(maxsize=4)
def _cached(path: str, files: tuple):
    proc = _opened(path)
    _check_usable(path, proc)
    return proc


def load_processor(path: str, files: tuple[tuple[str, str], ...] | None = None):
    """The folder's processor (cached per process); with `files`, ConfigError unless the folder's processor
    files are still those (same names, same sha256)."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isdir(path):
        raise ConfigError(f"the model folder {path} that the dataset's image policy runs the processor of does not "
                          "exist here: copy it to that path (the policy names it) or reshard with --tokenizer DIR")
    now = folder_files(path)
    if files is not None and tuple(map(tuple, files)) != now:
        changed = sorted({n for n, _ in files} ^ {n for n, _ in now} | {n for (n, h) in files if (n, h) not in now})
        raise ConfigError(f"the processor files of {path} changed since the dataset was sharded ({', '.join(changed)}"
                          "): its image tokens and pixels may differ; restore the folder or reshard with it")
    return _cached(path, now)
