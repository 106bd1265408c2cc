"""A Hugging Face model or processor folder, read once: tokenizer, chat template, image processor, config.

Files read (those present): `tokenizer.json` (required), `tokenizer_config.json`,
`special_tokens_map.json`, the chat template (`chat_template.jinja`, else
`chat_template.json`, else `tokenizer_config.json`'s `chat_template`, the
precedence transformers' processors use), `preprocessor_config.json`,
`processor_config.json`, `config.json`.

The tokenizer identity is the SHA-256 of the tokenizer files and the chat
template (what decides the token ids); the vision files are hashed apart
(what decides the image tokens). Datasets can be mixed only when both agree.

A model folder is input, not trusted code (`read_model_file`): every file is
size-checked before it is read (`tokenizer.json` up to 512 MiB, the others
16 MiB: a 2 GB file is a ConfigError, not a 2 GB read), must be a regular file,
and a symlink may lead only inside the folder (or, for a Hugging Face cache
snapshot `.../models--X/snapshots/REV`, into that repository's `blobs/`, where
the hub keeps the files its snapshot links name); one leading elsewhere is
refused.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field

from vlmdata.errors import ConfigError

__all__ = ["MAX_MODEL_FILE_BYTES", "MAX_TOKENIZER_BYTES", "ModelFolder", "TOKENIZER_FILES", "VISION_FILES",
           "is_model_folder", "read_model_file"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")
VISION_FILES = ("preprocessor_config.json", "processor_config.json", "config.json", "video_preprocessor_config.json")
MAX_TOKENIZER_BYTES = 512 << 20       # the largest real tokenizer.json files are tens of MB
MAX_MODEL_FILE_BYTES = 16 << 20       # configs and chat templates are KB


def _allowed_roots(root: str) -> list[str]:
    """Where a model folder's files may really be: the folder, and a hub cache snapshot's `blobs/`."""
    real = os.path.realpath(root)
    roots = [real]
    snapshots = os.path.dirname(real)
    if os.path.basename(snapshots) == "snapshots" and os.path.basename(os.path.dirname(snapshots)).startswith(
            ("models--", "datasets--")):
        roots.append(os.path.join(os.path.dirname(snapshots), "blobs"))
    return roots


def read_model_file(root: str, name: str, limit: int = MAX_MODEL_FILE_BYTES) -> bytes | None:
    """The bytes of `root/name` (None if there is none): a regular file of at most `limit` bytes, reached
    through symlinks only inside the folder (see the module docstring); ConfigError otherwise."""
    path = os.path.join(root, name)
    if not os.path.lexists(path):
        return None
    real = os.path.realpath(path)
    if not any(real.startswith(r + os.sep) for r in _allowed_roots(root)):
        raise ConfigError(f"{path} leads outside the model folder (to {real}); copy the file into the folder")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)   # a FIFO cannot block
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise ConfigError(f"{path} is {st.st_size} bytes, more than a model folder's {name} may be "
                              f"({limit} bytes): not read")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"{path} grew past {limit} bytes while read")
    return data


def is_model_folder(spec: str | None) -> bool:
    """True when `spec` names a local directory (a model or processor folder)."""
    return bool(spec) and os.path.isdir(os.fspath(spec))


def _limit(name: str) -> int:
    return MAX_TOKENIZER_BYTES if name == "tokenizer.json" else MAX_MODEL_FILE_BYTES


def _digest(root: str, names: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for name in names:
        data = read_model_file(root, name, _limit(name))
        if data is not None:
            h.update(name.encode() + b"\0")
            h.update(data)
            h.update(b"\0")
    return h.hexdigest()


def _text(root: str, name: str) -> str | None:
    data = read_model_file(root, name, _limit(name))
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{os.path.join(root, name)} is not UTF-8 text: {exc}") from exc


def _json(root: str, name: str) -> dict:
    path = os.path.join(root, name)
    raw = _text(root, name)
    if raw is None:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a JSON object")
    return data


def _template_source(value) -> str | None:
    """A chat template from a config value: a string, or a list of named templates ("default" wins)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return None


@dataclass
class ModelFolder:
    """What a model folder says; `load` reads and checks it."""

    path: str
    tokenizer_json: str
    tokenizer_config: dict
    chat_template: str | None
    preprocessor: dict
    processor: dict
    config: dict
    tokenizer_sha256: str
    vision_sha256: str
    special_map: dict = field(default_factory=dict)

    @classmethod
    def load(cls, path: str) -> ModelFolder:
        path = os.path.abspath(os.fspath(path))
        if not os.path.isdir(path):
            raise ConfigError(f"model folder {path} does not exist")
        tokenizer_json = _text(path, "tokenizer.json")
        if tokenizer_json is None:
            present = ", ".join(sorted(os.listdir(path))) or "nothing"
            raise ConfigError(f"model folder {path} has no tokenizer.json (it holds {present}); vlmdata reads the "
                              "fast tokenizer file a Hugging Face model ships (save one with "
                              "AutoTokenizer.from_pretrained(...).save_pretrained(folder))")
        tok_cfg = _json(path, "tokenizer_config.json")
        template = _text(path, "chat_template.jinja")
        if template is None:
            template = _template_source(_json(path, "chat_template.json").get("chat_template"))
        if template is None:
            template = _template_source(tok_cfg.get("chat_template"))
        return cls(path=path, tokenizer_json=tokenizer_json, tokenizer_config=tok_cfg, chat_template=template,
                   preprocessor=_json(path, "preprocessor_config.json"), processor=_json(path, "processor_config.json"),
                   config=_json(path, "config.json"), tokenizer_sha256=_digest(path, TOKENIZER_FILES),
                   vision_sha256=_digest(path, VISION_FILES), special_map=_json(path, "special_tokens_map.json"))

    def read_json(self, name: str) -> dict:
        """Another JSON file of the folder (e.g. video_preprocessor_config.json); {} when it has none."""
        return _json(self.path, name)

    def special_token(self, name: str) -> str | None:
        """A special token's text (`bos_token`, `eos_token`, ...) from tokenizer_config / special_tokens_map."""
        for source in (self.tokenizer_config, self.special_map):
            value = source.get(name)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                return value
        return None

    def hints(self) -> dict:
        """The names that tell the model family: model_type, processor and image processor classes."""
        return {"model_type": self.config.get("model_type"),
                "processor_class": self.processor.get("processor_class") or self.preprocessor.get("processor_class")
                or self.tokenizer_config.get("processor_class"),
                "image_processor_type": self.preprocessor.get("image_processor_type")}
