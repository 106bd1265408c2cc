"""One interface for turning a `Conversation` into token ids and loss flags, whatever the tokenizer.

`load_text_encoder(spec)`:
    None / "bytes"          vlmdata's byte tokenizer and its own layout (the default, as before)
    a tokenizers JSON file  that tokenizer with vlmdata's own layout and special tokens (as before)
    a model folder          the model's family (`text.families`): its tokenizer, chat template, image tokens

Every encoder has `encode(conv) -> (2, T) int32`, `encode_batch`, `image_token_id`,
`pad_token_id`, `identity()` (recorded in the manifest) and `family` (None for
vlmdata's own layouts).
"""
from __future__ import annotations

import numpy as np

from vlmdata.errors import ConfigError
from vlmdata.text.conversation import Conversation, turns_from_messages
from vlmdata.text.model_folder import is_model_folder
from vlmdata.text.tokenizer import Tokenizer, encode_conversation, load_tokenizer

__all__ = ["BuiltinEncoder", "load_text_encoder"]


class BuiltinEncoder:
    """vlmdata's own layout (BOS, role tokens, EOS after assistant turns) over a byte or tokenizers-JSON tokenizer."""

    family = None

    def __init__(self, tok: Tokenizer, train_on: str = "assistant"):
        if train_on != "assistant":
            raise ConfigError("train_on applies to model folders (--tokenizer MODEL_DIR); vlmdata's own layout "
                              "trains on the assistant turns")
        self.tok = tok
        self.image_token_id = tok.special.image
        self.pad_token_id = tok.special.pad

    def encode(self, conv: Conversation) -> np.ndarray:
        if conv.kind == "document":
            text = "".join("<image>" if i.get("type") == "image" else i.get("text", "")
                           for m in conv.messages for i in m["content"])
            turns = [("assistant", text)]
        else:
            turns = turns_from_messages(conv.messages)
        return encode_conversation(self.tok, turns, conv.n_images)

    def encode_batch(self, convs: list[Conversation]) -> list[np.ndarray | ValueError]:
        out: list[np.ndarray | ValueError] = []
        for c in convs:
            try:
                out.append(self.encode(c))
            except ValueError as exc:
                out.append(exc)
        return out

    def identity(self) -> dict:
        return self.tok.identity()


def load_text_encoder(spec: str | None = None, train_on: str = "assistant", family: str | None = None):
    """The encoder for a `--tokenizer` value (see the module docstring); ConfigError when it cannot be loaded."""
    if is_model_folder(spec):
        from vlmdata.text.families.registry import load_family

        return load_family(spec, train_on, family)
    if family is not None:
        raise ConfigError("--family needs --tokenizer MODEL_DIR (a model folder)")
    try:
        return BuiltinEncoder(load_tokenizer(spec), train_on)
    except (OSError, ValueError, ImportError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"cannot load tokenizer {spec!r}: {exc}") from exc
