"""Turning one raw input row into a sample: id, chat turns, image references, source record.

LLaVA / ShareGPT rows hold `conversations` (`from`: human/gpt, also user/assistant/system;
`value`: text with `<image>` markers), `image` or `images`, and optionally a top-level `system`
prompt; system turns stay system turns. Chat `messages`, the_cauldron and interleaved-document
rows are normalised in `layouts`. Caption rows
(JSONL/CSV/Parquet/folder) hold an image column and a text column, found by
name (`--image-column` / `--text-column` override); they become a user turn
holding the image(s) followed by the caption as the assistant turn.

Videos: LLaVA / ShareGPT rows name clips in `video` / `videos` (placed at their `<video>` markers, else
at the start of the first user turn), caption rows in a `video` column (a clip and its caption), chat
`messages` in `{"type": "video"}` items (ingest.layouts); a row may mix images and videos. A row that
carries a video some other way (ingest.video) is skipped as `video_unsupported`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from vlmdata.errors import RowProblem, Skip
from vlmdata.ingest.layouts import apply_columns, detect_layout, normalize_layout
from vlmdata.ingest.video import FrameList, reject_unparsed_video, reject_video_refs, video_refs
from vlmdata.text.conversation import VIDEO_MARKER, Conversation, messages_from_turns, turns_from_messages
from vlmdata.text.tokenizer import IMAGE_MARKER

IMAGE_COLUMNS = ("images", "image", "image_path", "image_file", "img", "path", "file", "filename",
                 "file_name", "url", "image_url", "jpg")
TEXT_COLUMNS = ("caption", "text", "txt", "description", "alt", "alt_text", "title")
ID_COLUMNS = ("id", "key", "__key__", "uid", "sample_id")
ROLES = {"human": "user", "user": "user", "system": "system", "gpt": "assistant", "assistant": "assistant"}


@dataclass(frozen=True)
class ColumnSpec:
    """Column names for caption tables (None = auto-detect per row); `mapping` renames a table's own
    columns to the names the layouts read (`--columns`, see ingest.layouts.parse_columns)."""

    image: str | None = None
    text: str | None = None
    id: str | None = None
    mapping: tuple[tuple[str, str], ...] = ()


@dataclass
class SourceSample:
    """A normalized row. `images` and `videos` hold URLs/paths (str) or embedded bytes."""

    id: str
    turns: list[tuple[str, str]]
    images: list
    meta: dict
    caption_file: str | None = None
    extra: dict = field(default_factory=dict)
    conversation: Conversation | None = None   # the layouts of ingest.layouts set it; else built from turns
    videos: list = field(default_factory=list)

    def to_conversation(self) -> Conversation:
        """The model-independent form every text encoder takes."""
        if self.conversation is not None:
            return self.conversation
        n, v = len(self.images), len(self.videos)
        return Conversation(messages_from_turns(self.turns, n, v), n, n_videos=v)


def id_columns(columns: ColumnSpec) -> tuple[str, ...]:
    """The columns a row's id may come from, in order."""
    return (columns.id,) if columns.id else ID_COLUMNS


def row_id(data: dict, columns: ColumnSpec, fallback: str) -> str:
    """The row's source id (an id column, else `fallback`, e.g. input name + row number)."""
    for name in id_columns(columns):
        value = data.get(name)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            return str(value)
    return fallback


def _first(data: dict, names) -> str | None:
    for n in names:
        if n in data and data[n] is not None:
            return n
    return None


def _json_safe(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes>"
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _image_refs(value) -> list:
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        return [value]
    if isinstance(value, dict):  # Hugging Face style {"bytes": ..., "path": ...}
        return [value.get("bytes") or value.get("path")]
    if isinstance(value, (list, tuple)):
        return [r for v in value for r in _image_refs(v)]
    raise RowProblem(Skip.BAD_IMAGE_REF, f"image reference of type {type(value).__name__}")


def _llava(data: dict, sid: str, native: bool) -> SourceSample:
    conv = data.get("conversations")
    if not isinstance(conv, list) or not conv:
        raise RowProblem(Skip.BAD_TEXT, "conversations is not a non-empty list")
    turns = []
    for t in conv:
        if not isinstance(t, dict):
            raise RowProblem(Skip.BAD_TEXT, "a conversation turn is not an object")
        role = ROLES.get(str(t.get("from", t.get("role", ""))).lower())
        value = t.get("value", t.get("content"))
        if role is None:
            raise RowProblem(Skip.BAD_TEXT, f"unknown role {t.get('from', t.get('role'))!r}")
        if not isinstance(value, str):
            raise RowProblem(Skip.BAD_TEXT, f"turn text is a {type(value).__name__}, not a string")
        turns.append((role, value))
    system = data.get("system")
    if isinstance(system, str) and system and not (turns and turns[0][0] == "system"):
        turns.insert(0, ("system", system))
    images = _image_refs(data.get("images", data.get("image")))
    return SourceSample(id=sid, turns=turns, images=images, meta=data if native else _json_safe(data),
                        videos=_row_videos(data))


def _row_videos(data: dict) -> list:
    """The clips a row names in its `videos` and `video` fields (in that order)."""
    return video_refs(data.get("videos"), data) + video_refs(data.get("video"), data)


def _caption(data: dict, sid: str, columns: ColumnSpec, native: bool) -> SourceSample:
    if "caption_file" in data:  # folder row: an image or a clip, and its sidecar caption
        kind = "video" if "video" in data else "image"
        return SourceSample(id=sid, turns=[], images=[data[kind]] if kind == "image" else [],
                            videos=[data[kind]] if kind == "video" else [], meta={"id": sid, kind: data[kind]},
                            caption_file=data["caption_file"], extra={"folder": True})
    img_col = columns.image or _first(data, IMAGE_COLUMNS)
    txt_col = columns.text or _first(data, TEXT_COLUMNS)
    videos = _row_videos(data)
    if videos and (img_col is None or data.get(img_col) in (None, "", [])):   # a clip and its caption
        img_col = None
    elif img_col is None or data.get(img_col) in (None, "", []):
        raise RowProblem(Skip.MISSING_IMAGE_REF, f"no image column value (looked for {columns.image or IMAGE_COLUMNS}; "
                                                 f"the row has columns {', '.join(map(str, data))})")
    if txt_col is None or txt_col not in data:
        raise RowProblem(Skip.BAD_TEXT, f"no text column (looked for {columns.text or TEXT_COLUMNS}; "
                                        f"the row has columns {', '.join(map(str, data))})")
    text = data[txt_col]
    if not isinstance(text, str):
        raise RowProblem(Skip.BAD_TEXT, f"caption is a {type(text).__name__}, not a string")
    return SourceSample(id=sid, turns=[("user", ""), ("assistant", text)],
                        images=_image_refs(data[img_col]) if img_col else [], meta=data if native else _json_safe(data),
                        videos=videos)


def normalize(data: dict, sid: str, columns: ColumnSpec, native: bool = False) -> SourceSample:
    """A SourceSample for one row, or RowProblem. `native`: the row came from JSON (no bytes to hide)."""
    data = apply_columns(data, columns.mapping)
    layout = None if "conversations" in data else detect_layout(data)
    if "conversations" in data:
        sample = _llava(data, sid, native)
    elif layout is not None:
        conv, images, videos = normalize_layout(layout, data, _image_refs, video_refs)
        sample = SourceSample(id=sid, turns=turns_from_messages(conv.messages), images=images,
                              meta=data if native else _json_safe(data), conversation=conv, videos=videos)
    else:
        sample = _caption(data, sid, columns, native)
    reject_unparsed_video(data, len(sample.videos))
    reject_video_refs(sample.images)
    for ref in sample.images + [v for v in sample.videos if not isinstance(v, FrameList)]:
        if not isinstance(ref, (str, bytes)) or not ref:
            raise RowProblem(Skip.BAD_IMAGE_REF, f"image reference {ref!r:.60} is not a path, URL or bytes")
    return sample


def check_text(sample: SourceSample) -> None:
    """Empty text and marker/image count mismatches (after the caption file is read)."""
    if not any(text.replace(IMAGE_MARKER, "").replace(VIDEO_MARKER, "").strip() for _, text in sample.turns):
        raise RowProblem(Skip.EMPTY_TEXT, "all turns are empty")
    if sample.conversation is not None:  # item lists: images and videos counted by their items
        return
    for marker, refs, what in ((IMAGE_MARKER, sample.images, "images"), (VIDEO_MARKER, sample.videos, "videos")):
        markers = sum(text.count(marker) for _, text in sample.turns)
        if markers not in (0, len(refs)):
            raise RowProblem(Skip.MARKER_MISMATCH, f"{markers} {marker} markers for {len(refs)} {what}")

