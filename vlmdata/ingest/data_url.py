"""`data:` URLs (RFC 2397) as image references: `data:image/jpeg;base64,...` decoded to bytes, bounded.

A row may embed an image as a data URL wherever it may name a file (OpenAI-style `image_url`
items, LLaVA `image`/`images`, caption and table columns). The payload is base64 (standard or
URL-safe alphabet, whitespace and missing padding tolerated) or, without `;base64`, percent-encoded.
The decoded size is known from the encoded length, so a payload whose bytes would exceed
`--max-image-bytes` is `file_too_large` before anything is decoded. The media type must be an image
(`image/*`), `application/octet-stream` or absent; `video/*` in an image reference is `video_unsupported`;
a malformed URL is `bad_data_url`. The bytes then pass the same image checks as a file's. A video
reference (`media="video"`) takes `video/*`, `application/octet-stream` or no type; its bytes are probed
as a clip's.
"""
from __future__ import annotations

import base64
import binascii
import re
from urllib.parse import unquote_to_bytes

from vlmdata.errors import RowProblem, Skip

__all__ = ["decode_data_url", "elide_data_urls", "is_data_url"]

_WHITESPACE = re.compile(r"\s+")
_IMAGE_TYPES = ("", "application/octet-stream")
STORED_PREFIX_CHARS = 64     # a data URL in a stored record keeps only this much of itself (see elide_data_urls)


def is_data_url(ref) -> bool:
    """True for a string that starts with `data:` (any case)."""
    return isinstance(ref, str) and ref[:5].lower() == "data:"


def _media_type(header: str) -> tuple[str, bool]:
    """(media type, base64?) of the part between `data:` and the comma."""
    params = [p.strip() for p in header.split(";")]
    is_b64 = bool(params) and params[-1].lower() == "base64"
    if is_b64:
        params = params[:-1]
    return (params[0].lower() if params else ""), is_b64


def decode_data_url(ref: str, max_bytes: int, kind: str = "image") -> bytes:
    """The bytes a data URL holds (`kind` "image" or "video": what the reference names); RowProblem
    (bad_data_url, video_unsupported, file_too_large) otherwise."""
    comma = ref.find(",", 5)
    if comma < 0:
        raise RowProblem(Skip.BAD_DATA_URL, f"data URL {ref[:40]!r}... has no ',' before its data")
    media, is_b64 = _media_type(ref[5:comma])
    if kind == "image" and media.startswith("video/"):
        raise RowProblem(Skip.VIDEO_UNSUPPORTED, f"data URL of type {media} as an image; put clips in a video "
                                                 "field or item")
    if not media.startswith(f"{kind}/") and media not in _IMAGE_TYPES:
        raise RowProblem(Skip.BAD_DATA_URL, f"data URL of type {media[:60]!r}, not an {kind}")
    payload = ref[comma + 1:]
    if is_b64:
        return _base64(payload, max_bytes)
    if len(payload) // 3 > max_bytes:   # each encoded byte takes one to three characters
        raise RowProblem(Skip.FILE_TOO_LARGE, f"data URL of over {len(payload) // 3} bytes > --max-image-bytes "
                                              f"{max_bytes}")
    data = unquote_to_bytes(payload)
    if len(data) > max_bytes:
        raise RowProblem(Skip.FILE_TOO_LARGE, f"data URL of {len(data)} bytes > --max-image-bytes {max_bytes}")
    return data


def _base64(payload: str, max_bytes: int) -> bytes:
    text = _WHITESPACE.sub("", payload)
    size = len(text) * 3 // 4
    if size > max_bytes + 2:
        raise RowProblem(Skip.FILE_TOO_LARGE, f"base64 data URL of about {size} bytes > --max-image-bytes "
                                              f"{max_bytes}")
    if "-" in text or "_" in text:
        text = text.replace("-", "+").replace("_", "/")
    text = text.rstrip("=")
    if len(text) % 4 == 1:
        raise RowProblem(Skip.BAD_DATA_URL, f"base64 data URL with {len(text)} characters: truncated")
    try:
        data = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RowProblem(Skip.BAD_DATA_URL, f"malformed base64 in data URL: {exc}") from None
    if not data:
        raise RowProblem(Skip.BAD_DATA_URL, "data URL holds no data")
    if len(data) > max_bytes:
        raise RowProblem(Skip.FILE_TOO_LARGE, f"data URL of {len(data)} bytes > --max-image-bytes {max_bytes}")
    return data


def elide_data_urls(value):
    """`value` (a row record) with every data URL cut to its first characters and its length, so a stored
    record does not hold each embedded image a second time; None when it holds no data URL."""
    found = False

    def walk(v):
        nonlocal found
        if is_data_url(v) and len(v) > STORED_PREFIX_CHARS:
            found = True
            return f"{v[:STORED_PREFIX_CHARS]}... ({len(v)} characters, stored as an image of the sample)"
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    out = walk(value)
    return out if found else None
