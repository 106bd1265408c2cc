"""The model-independent form of a sample's text, and its Hugging Face message form.

A `Conversation` is what every input layout is normalised to and what every
text encoder takes: `kind` "chat" (role turns, rendered with a chat template)
or "document" (interleaved text and images, no template, trained on all text),
and `messages` in the form transformers' processors take:
`[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "..."}]}, ...]`.
Images appear as `{"type": "image"}` items and videos as `{"type": "video"}` items, each kind in
order; their bytes live in the shard. `image_sizes` holds each image's stored (displayed) width and
height where the caller knows them (sharding and re-tokenizing do): a family whose text around an image
depends on its size (Gemma 3's pan-and-scan) needs them.

`messages_from_turns` converts the older (role, text with `<image>` / `<video>` markers)
turns: text is split at the markers; a conversation without markers of a kind (caption
rows) gets those images or videos at the start of its first user turn (videos first).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from vlmdata.text.tokenizer import IMAGE_MARKER

__all__ = ["VIDEO_MARKER", "Conversation", "messages_from_turns", "turns_from_messages"]

IMAGE_ITEM = {"type": "image"}
VIDEO_ITEM = {"type": "video"}
VIDEO_MARKER = "<video>"
_MARKER_OF = {"image": IMAGE_MARKER, "video": VIDEO_MARKER}
_MARKERS = re.compile(f"({re.escape(IMAGE_MARKER)}|{re.escape(VIDEO_MARKER)})")


@dataclass
class Conversation:
    """A sample's text: `kind` "chat" | "document", `messages` (HF form), `n_images` images and `n_videos`
    videos in order; `image_sizes`: the images' (width, height), None when not known."""

    messages: list[dict]
    n_images: int
    kind: str = "chat"
    n_videos: int = 0
    image_sizes: tuple[tuple[int, int], ...] | None = None


def _items(text: str) -> list[dict]:
    out = []
    for piece in _MARKERS.split(text):
        if piece == IMAGE_MARKER:
            out.append(dict(IMAGE_ITEM))
        elif piece == VIDEO_MARKER:
            out.append(dict(VIDEO_ITEM))
        elif piece:
            out.append({"type": "text", "text": piece})
    return out


def _open_first_user_turn(messages: list[dict], items: list[dict]) -> None:
    target = next((m for m in messages if m["role"] == "user"), None)
    if target is None:
        target = {"role": "user", "content": []}
        messages.insert(0, target)
    target["content"][:0] = items


def messages_from_turns(turns: list[tuple[str, str]], n_images: int, n_videos: int = 0) -> list[dict]:
    """HF messages from (role, text) turns with `<image>` / `<video>` markers (see the module docstring)."""
    messages = [{"role": role, "content": _items(text)} for role, text in turns]
    leading = []
    if n_videos and not any(VIDEO_MARKER in text for _, text in turns):
        leading += [dict(VIDEO_ITEM) for _ in range(n_videos)]
    if n_images and not any(IMAGE_MARKER in text for _, text in turns):
        leading += [dict(IMAGE_ITEM) for _ in range(n_images)]
    if leading:
        _open_first_user_turn(messages, leading)
    return messages


def turns_from_messages(messages: list[dict]) -> list[tuple[str, str]]:
    """(role, text with `<image>` / `<video>` markers) turns, for vlmdata's built-in byte-tokenizer layout."""
    turns = []
    for m in messages:
        content = m["content"]
        if isinstance(content, str):
            turns.append((m["role"], content))
            continue
        turns.append((m["role"], "".join(_MARKER_OF.get(i.get("type"), i.get("text", "")) for i in content)))
    return turns
