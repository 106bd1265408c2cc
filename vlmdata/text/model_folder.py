"""A Hugging Face model or processor folder, read once: tokenizer, chat template, image processor, config.

Files read (those present): `tokenizer.json` (required), `tokenizer_config.json`,
`special_tokens_map.json`, the chat template (`chat_template.jinja`, else
`chat_template.json`, else `tokenizer_config.json`'s `chat_template`, the
precedence transformers' processors use), `preprocessor_config.json`,
`processor_config.json`, `config.json`.

The tokenizer identity is the SHA-256 of the tokenizer files and the chat
template (what decides the token ids); the vision files are hashed apart
(what decides the image tokens). Datasets can be mixed only when both agree.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

from vlmdata.errors import ConfigError

__all__ = ["ModelFolder", "TOKENIZER_FILES", "VISION_FILES", "is_model_folder"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")
VISION_FILES = ("preprocessor_config.json", "processor_config.json", "config.json")


def is_model_folder(spec: str | None) -> bool:
    """True when `spec` names a local directory (a model or processor folder)."""
    return bool(spec) and os.path.isdir(os.fspath(spec))


def _digest(root: str, names: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for name in names:
        path = os.path.join(root, name)
        if os.path.isfile(path):
            h.update(name.encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
            h.update(b"\0")
    return h.hexdigest()


def _json(root: str, name: str) -> dict:
    path = os.path.join(root, name)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
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
        tok_path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tok_path):
            present = ", ".join(sorted(os.listdir(path))) or "nothing"
            raise ConfigError(f"model folder {path} has no tokenizer.json (it holds {present}); vlmdata reads the "
                              "fast tokenizer file a Hugging Face model ships (save one with "
                              "AutoTokenizer.from_pretrained(...).save_pretrained(folder))")
        with open(tok_path, encoding="utf-8") as f:
            tokenizer_json = f.read()
        tok_cfg = _json(path, "tokenizer_config.json")
        template = None
        jinja_path = os.path.join(path, "chat_template.jinja")
        if os.path.isfile(jinja_path):
            with open(jinja_path, encoding="utf-8") as f:
                template = f.read()
        if template is None:
            template = _template_source(_json(path, "chat_template.json").get("chat_template"))
        if template is None:
            template = _template_source(tok_cfg.get("chat_template"))
        return cls(path=path, tokenizer_json=tokenizer_json, tokenizer_config=tok_cfg, chat_template=template,
                   preprocessor=_json(path, "preprocessor_config.json"), processor=_json(path, "processor_config.json"),
                   config=_json(path, "config.json"), tokenizer_sha256=_digest(path, TOKENIZER_FILES),
                   vision_sha256=_digest(path, VISION_FILES), special_map=_json(path, "special_tokens_map.json"))

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
