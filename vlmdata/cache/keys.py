"""Cache keys: validation and the file names they map to.

A key is any string naming a shard (usually its URL). Keys never name a file
directly: the on-disk name is a hash of the key, so no key can point outside
the cache directory. Keys that look like path tricks are still rejected
outright (defence in depth, and a clear error for a buggy caller).
"""
from __future__ import annotations

import hashlib
import os

from vlmdata.errors import BadKeyError

MAX_KEY_LEN = 4096


def validate_key(key: str) -> str:
    """Return `key` unchanged, or raise BadKeyError for '..', absolute paths, NULs, empty keys."""
    if not isinstance(key, str) or not key:
        raise BadKeyError("cache key must be a non-empty string")
    if len(key) > MAX_KEY_LEN:
        raise BadKeyError(f"cache key longer than {MAX_KEY_LEN} characters")
    if "\x00" in key:
        raise BadKeyError("cache key contains a NUL byte")
    if key.startswith(("/", "\\", "~")) or (len(key) > 1 and key[1] == ":" and key[0].isalpha()):
        raise BadKeyError(f"cache key is an absolute path: {key!r}")
    if key.startswith("file://"):
        raise BadKeyError(f"cache key is an absolute path: {key!r}")
    parts = key.replace("\\", "/").split("/")
    if any(p == ".." for p in parts):
        raise BadKeyError(f"cache key contains '..': {key!r}")
    return key


def entry_name(key: str) -> str:
    """The file stem of a key's cache entry: a hash, never derived from the key's path parts."""
    return hashlib.sha256(validate_key(key).encode("utf-8")).hexdigest()[:40]


def key_for(ref) -> str:
    """The validated cache key of a ShardRef.

    An explicit `ref.key` must be a plain relative name (validated strictly). Without one (or when the
    key is the URL itself) the key is derived from the URL, prefixed with "url:" (local paths are made absolute and normalised first), so
    that it names the object, never a location in the cache; URLs containing '..' are rejected.
    """
    if ref.key and ref.key != ref.url:
        return validate_key(ref.key)
    url = ref.url
    if not isinstance(url, str) or not url:
        raise BadKeyError("shard URL must be a non-empty string")
    if "://" not in url or url.startswith("file://"):
        path = url[len("file://"):] if url.startswith("file://") else url
        if any(p == ".." for p in path.replace("\\", "/").split("/")):
            raise BadKeyError(f"shard path contains '..': {url!r}")
        return validate_key("url:file://" + os.path.abspath(path))
    scheme, rest = url.split("://", 1)
    if any(p == ".." for p in rest.split("/")):
        raise BadKeyError(f"shard URL contains '..': {url!r}")
    return validate_key(f"url:{scheme}://{rest}")
