"""Row layouts beyond LLaVA and captions, each normalised to a `Conversation` (model-independent).

Detected from a row's keys (after `--columns` renames them, see `apply_columns`):

  "messages"     OpenAI / TRL chat rows: `messages` of {role, content}, content a string or a list of
                 {"type": "text", "text"} / {"type": "image"[, "image": ref]} / {"type": "image_url",
                 "image_url": {"url": ref}} items; `{"type": "image"}` items without a reference take the
                 row's `images` list in order. Videos likewise: {"type": "video"[, "video": ref]} /
                 {"type": "video_url", "video_url": {"url": ref}} items (a list of frame images with an `fps`
                 in the item is a frame list), unreferenced ones taking the row's `videos` list; string
                 messages place the row's `videos` at `<video>` markers.
  "cauldron"     Hugging Face `datasets` exports in the_cauldron layout: `images` (list of {bytes, path}) and
                 `texts` (list of {"user", "assistant"}); the images open the first user turn.
  "interleaved"  OBELICS-style documents: parallel `images` and `texts` lists, each position an image or a
                 text (the other None). MMC4-style documents: `text_list` and `image_info`
                 ({image_name | url | raw_url, matched_text_index}). No chat template; trained on all text.

LLaVA / ShareGPT rows (`conversations`) and caption rows stay in `records`; there a
top-level `system` field and `system` turns are kept as system turns.
"""
from __future__ import annotations

from vlmdata.errors import ConfigError, RowProblem, Skip
from vlmdata.ingest.video import video_item_ref
from vlmdata.text.conversation import VIDEO_MARKER, Conversation, messages_from_turns

__all__ = ["CANONICAL_COLUMNS", "apply_columns", "detect_layout", "normalize_layout", "parse_columns"]

# Column names the layouts read; `--columns canonical=actual,...` maps a table's own names onto them.
CANONICAL_COLUMNS = ("id", "messages", "conversations", "system", "images", "image", "texts", "text", "caption",
                     "text_list", "image_info")


def parse_columns(text: str | None) -> tuple[tuple[str, str], ...]:
    """`--columns` "canonical=actual,..." as ((canonical, actual), ...); ConfigError says what is wrong."""
    if not text:
        return ()
    out = []
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise ConfigError(f"--columns entry {part!r} is not NAME=COLUMN (e.g. --columns messages=chat,images=pics)")
        name, col = (s.strip() for s in part.split("=", 1))
        if name not in CANONICAL_COLUMNS:
            raise ConfigError(f"--columns names {name!r}, not one of {', '.join(CANONICAL_COLUMNS)}")
        if not col:
            raise ConfigError(f"--columns {name}= needs a column name")
        out.append((name, col))
    return tuple(out)


def apply_columns(data: dict, mapping: tuple[tuple[str, str], ...]) -> dict:
    """The row with its mapped columns renamed to the canonical names; a missing one is a RowProblem
    that lists the columns the row has."""
    if not mapping:
        return data
    out = dict(data)
    for name, col in mapping:
        if col not in data:
            raise RowProblem(Skip.BAD_TEXT, f"no column {col!r} (mapped to {name}); the row has columns "
                                            f"{', '.join(map(str, data)) or 'none'}")
        out[name] = out.pop(col)
    return out


def detect_layout(data: dict) -> str | None:
    """"messages" | "cauldron" | "interleaved" for the layouts of this module, else None."""
    if "messages" in data:
        return "messages"
    texts = data.get("texts")
    if isinstance(texts, list) and texts and all(isinstance(t, dict) for t in texts):
        return "cauldron"
    if isinstance(texts, list) and isinstance(data.get("images"), list):
        return "interleaved"
    if "text_list" in data and "image_info" in data:
        return "interleaved"
    return None


def _ref(value):
    if isinstance(value, dict):
        if isinstance(value.get("image_url"), dict):
            return value["image_url"].get("url")
        for key in ("image", "image_url", "url", "path", "bytes"):
            v = value.get(key)
            if isinstance(v, dict):
                v = v.get("bytes") or v.get("path") or v.get("url")
            if isinstance(v, (str, bytes)) and v:
                return v
        return None
    return value if isinstance(value, (str, bytes)) and value else None


class _Queue:
    """A row's references of one kind (images or videos), taken in order by items that name none."""

    def __init__(self, what: str, refs: list):
        self.what, self.refs, self.left = what, refs, list(refs)
        self.taken: list = []

    def take(self, ref) -> None:
        if ref is None:
            if not self.left:
                raise RowProblem(Skip.MARKER_MISMATCH, f"more {self.what} items than the {len(self.refs)} "
                                                       f"{self.what}s of the row")
            ref = self.left.pop(0)
        self.taken.append(ref)

    def check_used(self) -> None:
        if self.left:
            raise RowProblem(Skip.MARKER_MISMATCH, f"{len(self.refs)} {self.what}s for "
                                                   f"{len(self.refs) - len(self.left)} {self.what} items")


def _messages(data: dict, refs_of, videos_of) -> tuple[Conversation, list, list]:
    raw = data["messages"]
    if not isinstance(raw, list) or not raw:
        raise RowProblem(Skip.BAD_TEXT, "messages is not a non-empty list")
    row_images = refs_of(data.get("images", data.get("image")))
    row_videos = videos_of(data.get("videos"), data) + videos_of(data.get("video"), data)
    images, videos = _Queue("image", row_images), _Queue("video", row_videos)
    messages, marker_turns, has_items = [], [], False
    for m in raw:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RowProblem(Skip.BAD_TEXT, "a message is not an object with a string role")
        role, content = m["role"], m.get("content")
        if role not in ("system", "user", "assistant"):
            raise RowProblem(Skip.BAD_TEXT, f"unknown role {role!r} (use system, user or assistant)")
        if isinstance(content, str):
            marker_turns.append((role, content))
            messages.append(None)
            continue
        if not isinstance(content, list):
            raise RowProblem(Skip.BAD_TEXT, f"message content is a {type(content).__name__}, not a string or list")
        has_items = True
        items = []
        for item in content:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "text" and isinstance(item.get("text"), str):
                items.append({"type": "text", "text": item["text"]})
            elif kind in ("image", "image_url"):
                images.take(_ref(item))
                items.append({"type": "image"})
            elif kind in ("video", "video_url"):
                videos.take(video_item_ref(item))
                items.append({"type": "video"})
            else:
                raise RowProblem(Skip.BAD_TEXT, f"content item {str(item)[:60]!r} is not a text, image or video item")
        messages.append({"role": role, "content": items})
        marker_turns.append((role, None))
    if not has_items:  # plain-string chat: LLaVA-style markers (or images and videos opening the first user turn)
        n, v = len(row_images), len(row_videos)
        return Conversation(messages_from_turns(marker_turns, n, v), n, n_videos=v), row_images, row_videos
    images.check_used()
    videos.check_used()
    for i, (role, text) in enumerate(marker_turns):
        if messages[i] is None:
            for marker in ("<image>", VIDEO_MARKER):
                if marker in text:
                    raise RowProblem(Skip.MARKER_MISMATCH, f"{marker} markers in a string message beside item lists")
            messages[i] = {"role": role, "content": [{"type": "text", "text": text}] if text else []}
    return Conversation(messages, len(images.taken), n_videos=len(videos.taken)), images.taken, videos.taken


def _cauldron(data: dict, refs_of, videos_of) -> tuple[Conversation, list, list]:
    turns = []
    for t in data["texts"]:
        user, assistant = t.get("user"), t.get("assistant")
        if not isinstance(user, str) or not isinstance(assistant, str):
            raise RowProblem(Skip.BAD_TEXT, "a texts entry lacks string user/assistant fields")
        turns += [("user", user), ("assistant", assistant)]
    images = refs_of(data.get("images"))
    return Conversation(messages_from_turns(turns, len(images)), len(images)), images, []


def _interleaved(data: dict, refs_of, videos_of) -> tuple[Conversation, list, list]:
    items, images = [], []
    if "text_list" in data:  # MMC4
        texts, infos = data["text_list"], data["image_info"]
        if not isinstance(texts, list) or not isinstance(infos, list):
            raise RowProblem(Skip.BAD_TEXT, "text_list and image_info must be lists")
        before: dict[int, list] = {}
        for info in infos:
            ref = _ref({k: info.get(k) for k in ("image", "path", "url", "bytes")} | {
                "url": info.get("raw_url") or info.get("url"), "path": info.get("image_name") or info.get("path")}) \
                if isinstance(info, dict) else None
            if ref is None:
                raise RowProblem(Skip.BAD_IMAGE_REF, "an image_info entry names no image")
            before.setdefault(int(info.get("matched_text_index", 0)), []).append(ref)
        for k, text in enumerate(texts):
            for ref in before.pop(k, []):
                images.append(ref)
                items.append({"type": "image"})
            if not isinstance(text, str):
                raise RowProblem(Skip.BAD_TEXT, "text_list holds a non-string")
            items.append({"type": "text", "text": text})
        for refs in before.values():
            raise RowProblem(Skip.BAD_IMAGE_REF, f"{len(refs)} image(s) match no text of the document")
    else:  # OBELICS
        imgs, texts = data["images"], data["texts"]
        if len(imgs) != len(texts):
            raise RowProblem(Skip.BAD_TEXT, f"images ({len(imgs)}) and texts ({len(texts)}) differ in length")
        for im, text in zip(imgs, texts):
            if im is not None and text is not None:
                raise RowProblem(Skip.BAD_TEXT, "a document position holds both an image and a text")
            if im is not None:
                refs = refs_of(im)
                images += refs
                items += [{"type": "image"} for _ in refs]
            elif isinstance(text, str):
                items.append({"type": "text", "text": text})
    return Conversation([{"role": "user", "content": items}], len(images), kind="document"), images, []


def normalize_layout(layout: str, data: dict, refs_of, videos_of) -> tuple[Conversation, list, list]:
    """(conversation, image references, video references) of a row in one of this module's layouts; RowProblem
    if malformed. `refs_of(value)` / `videos_of(value)` turn an image / video column value into a list of
    references. Only `messages` rows hold videos."""
    fn = {"messages": _messages, "cauldron": _cauldron, "interleaved": _interleaved}[layout]
    return fn(data, refs_of, videos_of)
