"""Rows that carry a video: skipped and counted as `video_unsupported` until video support lands.

A row carries a video when it has a non-empty `video` / `videos` / `video_url` field anywhere (LLaVA-Video
rows, caption tables), a `{"type": "video"}` or `{"type": "video_url"}` content item (OpenAI / TRL
messages), a `<video>` marker in any of its strings, or an image reference that names a video
(a `data:video/...` URL or a file with a video extension). The word "video" in prose is not a video.
"""
from __future__ import annotations

from vlmdata.errors import RowProblem, Skip

__all__ = ["VIDEO_MARKER", "reject_video_refs", "reject_video_row", "video_in_row"]

VIDEO_MARKER = "<video>"
VIDEO_FIELDS = ("video", "videos", "video_url")
VIDEO_ITEM_TYPES = ("video", "video_url")
VIDEO_EXTS = (".mp4", ".m4v", ".mov", ".webm", ".mkv", ".avi", ".mpg", ".mpeg", ".flv", ".wmv", ".3gp")


def _empty(value) -> bool:
    """None, "", [], {}, False, 0: a video field that names no video (e.g. a table's empty column)."""
    return value is None or (isinstance(value, (str, list, tuple, dict, bool, int, float)) and not value)


def video_in_row(data: dict) -> str | None:
    """Why the row carries a video (for the skip detail), or None."""
    stack = [data]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if VIDEO_MARKER in v:
                return f"a {VIDEO_MARKER} marker in the text"
        elif isinstance(v, dict):
            if v.get("type") in VIDEO_ITEM_TYPES:
                return f"a {v['type']!r} content item"
            for key in VIDEO_FIELDS:
                if not _empty(v.get(key)):
                    return f"a {key!r} field"
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return None


def _video_ref(ref) -> bool:
    if not isinstance(ref, str):
        return False
    if ref[:11].lower() == "data:video/":
        return True
    return ref.split("?", 1)[0].lower().endswith(VIDEO_EXTS)


def _skip(why: str) -> RowProblem:
    return RowProblem(Skip.VIDEO_UNSUPPORTED, f"the row carries a video ({why}); videos are not supported yet")


def reject_video_row(data: dict) -> None:
    """RowProblem(video_unsupported) when the row carries a video (before its layout is parsed)."""
    why = video_in_row(data)
    if why is not None:
        raise _skip(why)


def reject_video_refs(image_refs: list) -> None:
    """RowProblem(video_unsupported) when one of the row's image references names a video."""
    if any(_video_ref(r) for r in image_refs):
        raise _skip("an image reference that names a video")
