"""Memmap shards: pre-resized images and tokens in one memory-mappable file per shard.

One file `shard-JJJJJJ-PP.mm` holds, in order (each section 64-byte aligned):

    images   uint8  (n_images, S, S, 3)   every image resized to S x S, RGB
    ids      int32  (n_tokens,)           token ids of all samples, concatenated
    loss     uint8  (n_tokens,)           loss flags, same layout
    meta     bytes                        each sample's source record (UTF-8 JSON), concatenated
    owners   uint64 (n_images,)           per image row, the tag of the sample image it is (key, j)
    footer   UTF-8 JSON with the section offsets, then 16 bytes: b"VLMMMAP1" + footer length (u64 LE)

The shard's SampleIndex (`.index.npz`) locates each sample: `tok_offset` /
`tok_size` are its first token and token count, `img_offset` the row of each
image in the image array, `meta_offset` / `meta_size` its bytes inside the
meta section; `width` / `height` stay the original image sizes. A footer
(not a header) lets the file be written in one pass with a running CRC32,
which ShardInfo records for the whole file, like for tar shards.

Owners (footer version 2): the tar path catches an index whose offsets point at another sample's
image by the member's name; a memmap image row has no name, so the shard stores one for it:
`owner_tag(key, j)` (8 bytes of BLAKE2b of the key and the image's place in its sample), checked
for every image a sample reads (one hash and one comparison per image: `read_sample`). Swapped or
shifted image rows in an index cost the samples concerned (IndexMismatchError, counted), never
deliver another sample's pixels. Shards written before (version 1, no owners) stay readable,
unverified beyond `memmap_bad_rows`'s bounds (`MemmapShard.verified` is False).
"""
from __future__ import annotations

import json
import struct
import zlib

import numpy as np

from vlmdata import fsutil
from vlmdata.errors import IndexMismatchError
from vlmdata.formats.index_checks import memmap_bad_rows, owner_tag
from vlmdata.formats.manifest import ShardInfo
from vlmdata.formats.sample import SampleRecord
from vlmdata.formats.sample_index import IndexBuilder, SampleIndex

MAGIC = b"VLMMMAP1"
TRAILER = struct.Struct("<8sQ")
ALIGN = 64


def memmap_names(stem: str) -> tuple[str, str]:
    """(data file, index file) names of a memmap shard stem."""
    return f"{stem}.mm", f"{stem}.index.npz"


class MemmapPartWriter:
    """Writes one memmap shard; images stream to disk, tokens and meta are kept until close."""

    def __init__(self, root: str, stem: str, image_size: int, storage_options: dict | None = None,
                 fsync: bool = True):
        self.root = root
        self.fsync = fsync
        self.image_size = image_size
        self.storage_options = storage_options or {}
        self.data_name, self.index_name = memmap_names(stem)
        self._file = fsutil.AtomicLocalFile(fsutil.join(root, self.data_name), self.storage_options, fsync)
        self._crc = 0
        self._size = 0
        self._n_images = 0
        self._ids: list[np.ndarray] = []
        self._loss: list[np.ndarray] = []
        self._meta: list[bytes] = []
        self._owners: list[int] = []
        self._n_tokens = 0
        self._meta_bytes = 0
        self._builder = IndexBuilder()

    def __len__(self) -> int:
        return len(self._builder)

    @property
    def offset(self) -> int:
        """Approximate bytes written so far (for shard-size limits)."""
        return self._size + self._n_tokens * 5 + self._meta_bytes

    def _write(self, data) -> None:
        data = memoryview(data).cast("B")  # arrays: count bytes, not rows
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)
        self._file.file.write(data)

    def _pad(self) -> None:
        pad = -self._size % ALIGN
        if pad:
            self._write(b"\0" * pad)

    def add(self, key: str, meta: dict, tokens: np.ndarray, images: list[np.ndarray],
            sizes: list[tuple[int, int]]) -> None:
        """Add a sample: tokens (2, T) int32, images (S, S, 3) uint8, original (w, h) per image."""
        s = self.image_size
        rows = []
        for j, (im, (w, h)) in enumerate(zip(images, sizes)):
            if im.shape != (s, s, 3) or im.dtype != np.uint8:
                raise ValueError(f"memmap image must be ({s}, {s}, 3) uint8, got {im.shape} {im.dtype}")
            self._write(np.ascontiguousarray(im).data)
            self._owners.append(owner_tag(key.encode("utf-8"), j))
            rows.append((self._n_images, s * s * 3, w, h))
            self._n_images += 1
        meta_bytes = json.dumps(meta, ensure_ascii=False).encode("utf-8")
        n = tokens.shape[1]
        self._builder.add(key, offset=self._n_tokens, span=n, tok=(self._n_tokens, n),
                          meta=(self._meta_bytes, len(meta_bytes)),
                          text_tokens=n - len(images), images=rows)
        self._ids.append(np.ascontiguousarray(tokens[0], dtype=np.int32))
        self._loss.append(np.ascontiguousarray(tokens[1], dtype=np.uint8))
        self._meta.append(meta_bytes)
        self._n_tokens += n
        self._meta_bytes += len(meta_bytes)

    def close(self) -> ShardInfo:
        """Write the token/meta sections and footer, publish the file, then its index."""
        sections = {"images": 0}
        self._pad()
        sections["ids"] = self._size
        for a in self._ids:
            self._write(a.data)
        self._pad()
        sections["loss"] = self._size
        for a in self._loss:
            self._write(a.data)
        self._pad()
        sections["meta"] = self._size
        for b in self._meta:
            self._write(b)
        self._pad()
        sections["owners"] = self._size
        self._write(np.asarray(self._owners, dtype="<u8").data)
        footer = json.dumps({"version": 2, "image_size": self.image_size, "n_images": self._n_images,
                             "n_tokens": self._n_tokens, "meta_bytes": self._meta_bytes,
                             "offsets": sections}, sort_keys=True).encode()
        self._write(footer)
        self._write(TRAILER.pack(MAGIC, len(footer)))
        index = self._builder.build().describes(self._size, self._crc & 0xFFFFFFFF)
        self._file.commit()
        fsutil.atomic_write_bytes(fsutil.join(self.root, self.index_name), index.to_bytes(), self.storage_options,
                                  self.fsync)
        return ShardInfo(name=self.data_name, index=self.index_name, samples=len(index),
                         images=index.n_image_total, bytes=self._size, crc32=self._crc & 0xFFFFFFFF,
                         dali_index=None, files=[self.data_name])

    def abort(self) -> None:
        self._file.abort()


class MemmapShard:
    """Random access to a memmap shard; `read_sample(i)` needs no decode.

    `MemmapShard(root, shard_info)` maps a local file (np.memmap) or reads a
    remote one whole; `MemmapShard.from_buffer(buf, index)` wraps bytes that a
    cache already holds.
    """

    def __init__(self, root: str, shard_info: ShardInfo, storage_options: dict | None = None):
        url = fsutil.join(root, shard_info.name)
        index = SampleIndex.load(fsutil.join(root, shard_info.index), storage_options)
        if fsutil.is_local(url):
            buf = np.memmap(fsutil.local_path(url), dtype=np.uint8, mode="r")
        else:
            buf = np.frombuffer(fsutil.read_bytes(url, storage_options), dtype=np.uint8)
        self._init(buf, index)

    @classmethod
    def from_buffer(cls, buf, index: SampleIndex) -> MemmapShard:
        self = cls.__new__(cls)
        self._init(np.frombuffer(buf, dtype=np.uint8), index)
        return self

    def _init(self, buf: np.ndarray, index: SampleIndex) -> None:
        if len(buf) < TRAILER.size:
            raise ValueError("memmap shard is too short (truncated?)")
        magic, footer_len = TRAILER.unpack(bytes(buf[-TRAILER.size:]))
        if magic != MAGIC:
            raise ValueError("not a vlmdata memmap shard (bad trailer magic)")
        footer = json.loads(bytes(buf[len(buf) - TRAILER.size - footer_len:len(buf) - TRAILER.size]))
        s, m, t = footer["image_size"], footer["n_images"], footer["n_tokens"]
        off = footer["offsets"]
        self.index = index
        self.image_size = s
        self.images_offset = off["images"]          # byte offset of image row 0 in the shard
        self.images = buf[off["images"]:off["images"] + m * s * s * 3].reshape(m, s, s, 3)
        self.ids = buf[off["ids"]:off["ids"] + 4 * t].view(np.int32)
        self.loss = buf[off["loss"]:off["loss"] + t]
        self.meta = buf[off["meta"]:off["meta"] + footer["meta_bytes"]]
        self.owners = buf[off["owners"]:off["owners"] + 8 * m].view("<u8") if "owners" in off else None
        self.verified = self.owners is not None
        self.bad_rows = memmap_bad_rows(index, len(self.images), len(self.ids), len(self.meta))

    def __len__(self) -> int:
        return len(self.index)

    def read_sample(self, i: int, with_meta: bool = False) -> SampleRecord:
        ix = self.index
        if self.bad_rows is not None and self.bad_rows[i]:
            raise IndexMismatchError(f"index row {i} points outside the memmap shard's arrays")
        start, n = int(ix.tok_offset[i]), int(ix.tok_size[i])
        tokens = np.empty((2, n), np.int32)
        tokens[0], tokens[1] = self.ids[start:start + n], self.loss[start:start + n]
        sl = ix.image_slice(i)
        rows = ix.img_offset[sl].tolist()
        key = bytes(ix.key[i])
        if self.owners is not None:
            for j, r in enumerate(rows):
                if int(self.owners[r]) != owner_tag(key, j):
                    raise IndexMismatchError(f"index row {i}: image {j} points at image row {r}, which belongs "
                                             "to another sample")
        images = [self.images[r] for r in rows]
        sizes = list(zip(ix.width[sl].tolist(), ix.height[sl].tolist()))
        meta = None
        if with_meta:
            mo = int(ix.meta_offset[i])
            meta = memoryview(self.meta[mo:mo + int(ix.meta_size[i])])
        return SampleRecord(key=key.decode("utf-8"), tokens=tokens, images=images, sizes=sizes,
                            meta_view=meta)
