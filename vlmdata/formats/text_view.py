"""Text views stored beside the shards: per-shard token files and a planning column, no image bytes.

    views/NAME/shard-000000-00.tok.npz   ids int32 [sum T], loss int8 [sum T], offsets int64 [n + 1]
    views/NAME/planning.npz              text_tokens int32 [N] (the dataset's samples, shard by shard)

Sample i of a shard has tokens ids[offsets[i]:offsets[i + 1]] with their loss
flags: one image token per image, expanded at load time by the view's image
policy, like the `.tok.npy` members of the default view. A sample the view's
tokenizer could not encode has no tokens (offsets[i] == offsets[i + 1]); the
loader skips it and counts it. Files are written atomically; the manifest entry
that names the view is written last, so a view is either complete or absent.
"""
from __future__ import annotations

import io
import re
from dataclasses import dataclass

import numpy as np

from vlmdata import fsutil
from vlmdata.formats.sample import SampleRecord, read_sample
from vlmdata.formats.sample_index import SampleIndex

__all__ = ["VIEWS_DIR", "ViewTokens", "check_view_name", "read_view_sample", "view_planning_name",
           "view_shard_name"]

VIEWS_DIR = "views"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")


def check_view_name(name: str) -> str:
    """A view name is a short file-name-safe word (letters, digits, '_', '.', '-')."""
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise ValueError(f"view name {name!r} must be 1-100 letters, digits, '_', '.' or '-' (starting with a "
                         "letter or digit)")
    return name


def view_shard_name(view: str, shard_name: str) -> str:
    """The token file of a shard (named by its data file) in a view, relative to the dataset root."""
    stem = shard_name[:-4] if shard_name.endswith(".tar") else shard_name
    return f"{VIEWS_DIR}/{view}/{stem}.tok.npz"


def view_planning_name(view: str) -> str:
    return f"{VIEWS_DIR}/{view}/planning.npz"


@dataclass
class ViewTokens:
    """One shard's tokens in a view."""

    ids: np.ndarray
    loss: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def build(cls, tokens: list[np.ndarray | None]) -> ViewTokens:
        """From (2, T) arrays per sample (None: not encoded)."""
        lengths = np.asarray([0 if t is None else t.shape[1] for t in tokens], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        kept = [t for t in tokens if t is not None and t.shape[1]]
        ids = np.concatenate([t[0] for t in kept]).astype(np.int32) if kept else np.zeros(0, np.int32)
        loss = np.concatenate([t[1] for t in kept]).astype(np.int8) if kept else np.zeros(0, np.int8)
        return cls(ids, loss, offsets)

    def tokens(self, i: int) -> np.ndarray:
        """(2, T) int32 ids and loss flags of sample i; ValueError when the view holds none for it."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        if a == b:
            raise ValueError(f"sample {i} has no tokens in this text view (its tokenizer could not encode it)")
        return np.stack([self.ids[a:b], self.loss[a:b].astype(np.int32)])

    def text_tokens(self, n_images: np.ndarray) -> np.ndarray:
        """Per-sample token counts without the image placeholders (the planning column)."""
        return (np.diff(self.offsets) - np.where(np.diff(self.offsets) > 0, n_images, 0)).astype(np.int32)

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, ids=self.ids, loss=self.loss, offsets=self.offsets)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> ViewTokens:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            return cls(z["ids"], z["loss"], z["offsets"])

    @classmethod
    def load(cls, url: str, storage_options: dict | None = None) -> ViewTokens:
        return cls.from_bytes(fsutil.read_bytes(url, storage_options))


def read_view_sample(buf, index: SampleIndex, i: int, view: ViewTokens, with_meta: bool = False) -> SampleRecord:
    """Sample i of a shard in memory, its images from the shard and its tokens from the view."""
    return read_sample(buf, index, i, with_meta=with_meta, text_decoder=lambda _member, _n: view.tokens(i))
