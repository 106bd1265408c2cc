"""The per-shard sample index: everything needed to plan without touching the bytes.

Stored as an uncompressed `.npz` of flat numpy arrays (one read, no pickle):

per sample (length N)
  key            S   sample key as written in the shard (utf-8 bytes)
  offset         i8  byte offset of the sample's first tar header
  span           i8  bytes from `offset` to the end of its last member (headers, data, padding)
  tok_offset     i8  data offset of the `.tok.npy` member (memmap: offset into the token array)
  tok_size       i8  its size in bytes (memmap: number of tokens)
  meta_offset    i8  data offset of the `.json` member (-1 when absent)
  meta_size      i8
  text_tokens    i4  token count, image (and video) placeholders excluded
  n_images       i2
  image_start    i8  index of the sample's first image in the per-image arrays

per image (length M = n_images.sum())
  img_offset     i8  data offset of the image member (memmap: row in the image array)
  img_size       i8  its size in bytes
  width, height  i4  read from the image header at shard time (original pixels)

per video (only in shards that hold clips: `formats.video_index`)
  n_videos, video_start, vid_*   where each clip and its probe member live, and its size, rotation,
                                 frames, duration and frame rate

the shard it describes (absent in indices written before it existed)
  shard          i8 (2,)  the shard file's size in bytes and its CRC32 (the manifest's `bytes` and `crc32`),
                 so a loader can tell an index that belongs to another shard (or another version of it)
"""
from __future__ import annotations

import io
import threading
from dataclasses import dataclass, fields

import numpy as np

from vlmdata import fsutil
from vlmdata.formats.video_index import VideoColumns, VideoColumnsBuilder

_NPY_PARSE_LOCK = threading.Lock()

SAMPLE_FIELDS = {
    "offset": np.int64, "span": np.int64,
    "tok_offset": np.int64, "tok_size": np.int64,
    "meta_offset": np.int64, "meta_size": np.int64,
    "text_tokens": np.int32, "n_images": np.int16, "image_start": np.int64,
}
IMAGE_FIELDS = {"img_offset": np.int64, "img_size": np.int64, "width": np.int32, "height": np.int32}


@dataclass
class SampleIndex:
    """Columnar index of one shard (see module docstring for the fields)."""

    key: np.ndarray
    offset: np.ndarray
    span: np.ndarray
    tok_offset: np.ndarray
    tok_size: np.ndarray
    meta_offset: np.ndarray
    meta_size: np.ndarray
    text_tokens: np.ndarray
    n_images: np.ndarray
    image_start: np.ndarray
    img_offset: np.ndarray
    img_size: np.ndarray
    width: np.ndarray
    height: np.ndarray
    shard_bytes: int | None = None    # the shard this index describes: its size and CRC32 (None: not recorded)
    shard_crc32: int | None = None
    videos: VideoColumns | None = None  # the clips' columns (None: built without; read as no clips)

    def __post_init__(self) -> None:
        if self.videos is None:
            self.videos = VideoColumns.empty(len(self.key))

    def __len__(self) -> int:
        return len(self.key)

    @property
    def n_image_total(self) -> int:
        return len(self.width)

    def image_slice(self, i: int) -> slice:
        start = int(self.image_start[i])
        return slice(start, start + int(self.n_images[i]))

    def keys(self) -> list[str]:
        return [k.decode("utf-8") for k in self.key.tolist()]

    def validate(self) -> None:
        """Raise ValueError if the arrays are inconsistent."""
        n = len(self.key)
        for f in SAMPLE_FIELDS:
            if len(getattr(self, f)) != n:
                raise ValueError(f"index field {f} has {len(getattr(self, f))} rows, expected {n}")
        m = int(self.n_images.sum()) if n else 0
        for f in IMAGE_FIELDS:
            if len(getattr(self, f)) != m:
                raise ValueError(f"index field {f} has {len(getattr(self, f))} rows, expected {m}")
        expected_start = np.concatenate([[0], np.cumsum(self.n_images, dtype=np.int64)[:-1]]) if n else np.zeros(0)
        if not np.array_equal(self.image_start, expected_start):
            raise ValueError("index image_start does not match n_images")
        self.videos.validate(n)

    def describes(self, shard_bytes: int, shard_crc32: int) -> SampleIndex:
        """Record the size and CRC32 of the shard this index describes (returns self)."""
        self.shard_bytes, self.shard_crc32 = int(shard_bytes), int(shard_crc32)
        return self

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        cols = {name: getattr(self, name) for name in _COLUMNS}
        if self.shard_bytes is not None and self.shard_crc32 is not None:
            cols["shard"] = np.asarray([self.shard_bytes, self.shard_crc32], dtype=np.int64)
        cols.update(self.videos.columns())
        np.savez(buf, **cols)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> SampleIndex:
        # np.load parses .npy headers with ast.literal_eval, and CPython 3.11's
        # compiler is not safe to enter from several threads at once (it can raise
        # "SystemError: AST constructor recursion depth mismatch"); indices are
        # fetched by thread pools, so parsing is serialised. Parsing is ~50 us.
        with _NPY_PARSE_LOCK, np.load(io.BytesIO(data), allow_pickle=False) as z:
            shard = z["shard"].tolist() if "shard" in z.files else [None, None]
            return cls(**{name: z[name] for name in _COLUMNS}, shard_bytes=shard[0], shard_crc32=shard[1],
                       videos=VideoColumns.from_npz(z, len(z["key"])))

    def save(self, url: str, storage_options: dict | None = None) -> None:
        fsutil.atomic_write_bytes(url, self.to_bytes(), storage_options)

    @classmethod
    def load(cls, url: str, storage_options: dict | None = None, retry=None) -> SampleIndex:
        """Read an index (with `retry`, a vlmdata.retry.RetryPolicy, transient read errors are retried)."""
        return cls.from_bytes(fsutil.read_bytes(url, storage_options, retry))


_COLUMNS = tuple(f.name for f in fields(SampleIndex) if f.name not in ("shard_bytes", "shard_crc32", "videos"))


class IndexBuilder:
    """Accumulates index rows while a shard is written."""

    def __init__(self) -> None:
        self._samples: dict[str, list] = {f: [] for f in SAMPLE_FIELDS}
        self._images: dict[str, list] = {f: [] for f in IMAGE_FIELDS}
        self._keys: list[bytes] = []
        self._videos = VideoColumnsBuilder()

    def add(self, key: str, *, offset: int, span: int, tok: tuple[int, int], meta: tuple[int, int],
            text_tokens: int, images: list[tuple[int, int, int, int]],
            videos: list[tuple[int, int, int, int, dict]] = ()) -> None:
        """Add one sample; `images` holds (offset, size, width, height) per image, `videos` (offset, size,
        probe offset, probe size, ClipInfo dict) per clip."""
        self._keys.append(key.encode("utf-8"))
        row = dict(offset=offset, span=span, tok_offset=tok[0], tok_size=tok[1], meta_offset=meta[0],
                   meta_size=meta[1], text_tokens=text_tokens, n_images=len(images),
                   image_start=len(self._images["width"]))
        for f, v in row.items():
            self._samples[f].append(v)
        for off, size, w, h in images:
            self._images["img_offset"].append(off)
            self._images["img_size"].append(size)
            self._images["width"].append(w)
            self._images["height"].append(h)
        self._videos.add(list(videos))

    def __len__(self) -> int:
        return len(self._keys)

    def build(self) -> SampleIndex:
        cols = {f: np.asarray(v, dtype=t) for f, t in SAMPLE_FIELDS.items() for v in [self._samples[f]]}
        cols.update({f: np.asarray(v, dtype=t) for f, t in IMAGE_FIELDS.items() for v in [self._images[f]]})
        key = np.asarray(self._keys, dtype=bytes) if self._keys else np.zeros(0, dtype="S1")
        idx = SampleIndex(key=key, **cols, videos=self._videos.build())
        idx.validate()
        return idx


def concat_planning_columns(indices: list[SampleIndex]) -> dict[str, np.ndarray]:
    """Merge the columns the planner needs across shards (keys and offsets left out).

    Returns shard (i4), local (i4, sample number inside its shard),
    text_tokens, n_images, image_start (into the merged image arrays), width, height.
    """
    shard = np.concatenate([np.full(len(ix), s, np.int32) for s, ix in enumerate(indices)]) if indices else np.zeros(0, np.int32)
    local = np.concatenate([np.arange(len(ix), dtype=np.int32) for ix in indices]) if indices else np.zeros(0, np.int32)
    text_tokens = np.concatenate([ix.text_tokens for ix in indices]) if indices else np.zeros(0, np.int32)
    n_images = np.concatenate([ix.n_images for ix in indices]) if indices else np.zeros(0, np.int16)
    width = np.concatenate([ix.width for ix in indices]) if indices else np.zeros(0, np.int32)
    height = np.concatenate([ix.height for ix in indices]) if indices else np.zeros(0, np.int32)
    image_start = np.concatenate([[0], np.cumsum(n_images, dtype=np.int64)[:-1]]) if len(n_images) else np.zeros(0, np.int64)
    return {"shard": shard, "local": local, "text_tokens": text_tokens, "n_images": n_images,
            "image_start": image_start.astype(np.int64), "width": width, "height": height}
