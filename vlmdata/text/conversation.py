"""The model-independent form of a sample's text, and its Hugging Face message form.

A `Conversation` is what every input layout is normalised to and what every
text encoder takes: `kind` "chat" (role turns, rendered with a chat template)
or "document" (interleaved text and images, no template, trained on all text),
and `messages` in the form transformers' processors take:
`[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "..."}]}, ...]`.
Images appear as `{"type": "image"}` items, in order; their bytes live in the shard.

`messages_from_turns` converts the older (role, text with `<image>` markers)
turns: text is split at the markers; a conversation without markers (caption
rows) gets its images at the start of its first user turn.
"""
from __future__ import annotations

from dataclasses import dataclass

from vlmdata.text.tokenizer import IMAGE_MARKER

__all__ = ["Conversation", "messages_from_turns", "turns_from_messages"]

IMAGE_ITEM = {"type": "image"}


@dataclass
class Conversation:
    """A sample's text: `kind` "chat" | "document", `messages` (HF form), `n_images` images in order."""

    messages: list[dict]
    n_images: int
    kind: str = "chat"


def _items(text: str) -> list[dict]:
    out = []
    for i, piece in enumerate(text.split(IMAGE_MARKER)):
        if i:
            out.append(dict(IMAGE_ITEM))
        if piece:
            out.append({"type": "text", "text": piece})
    return out


def messages_from_turns(turns: list[tuple[str, str]], n_images: int) -> list[dict]:
    """HF messages from (role, text) turns with `<image>` markers (see the module docstring)."""
    markers = sum(text.count(IMAGE_MARKER) for _, text in turns)
    messages = [{"role": role, "content": _items(text)} for role, text in turns]
    if markers == 0 and n_images:
        target = next((m for m in messages if m["role"] == "user"), None)
        if target is None:
            target = {"role": "user", "content": []}
            messages.insert(0, target)
        target["content"][:0] = [dict(IMAGE_ITEM) for _ in range(n_images)]
    return messages


def turns_from_messages(messages: list[dict]) -> list[tuple[str, str]]:
    """(role, text with `<image>` markers) turns, for vlmdata's built-in byte-tokenizer layout."""
    turns = []
    for m in messages:
        content = m["content"]
        if isinstance(content, str):
            turns.append((m["role"], content))
            continue
        turns.append((m["role"], "".join(IMAGE_MARKER if i.get("type") == "image" else i.get("text", "")
                                         for i in content)))
    return turns
