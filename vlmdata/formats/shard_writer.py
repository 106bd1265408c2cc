"""Writing one shard part: WebDataset tar + SampleIndex + DALI .idx, committed atomically.

A part is written to a temporary file (fsutil.AtomicLocalFile) and renamed
(or uploaded whole) on `close`; its index files follow. Nothing under the
final names exists until its bytes are complete.
"""
from __future__ import annotations

import zlib

import numpy as np

from vlmdata import fsutil
from vlmdata.formats.dali_idx import Member, format_index
from vlmdata.formats.manifest import ShardInfo
from vlmdata.formats.sample import EncodedImage, EncodedVideo, write_sample
from vlmdata.formats.sample_index import IndexBuilder
from vlmdata.formats.tar_writer import MemberLocation, TarShardWriter

TAR_MTIME = 0  # fixed member mtime: the same input gives the same bytes


class CrcFile:
    """A write-only file wrapper that keeps a running CRC32 and byte count."""

    def __init__(self, f):
        self._f = f
        self.crc = 0
        self.size = 0

    def write(self, data) -> int:
        self.crc = zlib.crc32(data, self.crc)
        self.size += len(data)
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()


class _RecordingTar(TarShardWriter):
    """TarShardWriter that remembers every member for the DALI index."""

    def __init__(self, fileobj):
        super().__init__(fileobj, mtime=TAR_MTIME)
        self.members: list[Member] = []

    def add(self, name: str, data: bytes) -> MemberLocation:
        loc = super().add(name, data)
        self.members.append(Member(name=name, offset=loc.data, size=loc.size))
        return loc


def shard_names(stem: str) -> tuple[str, str, str]:
    """(tar, index, dali index) file names of a shard stem."""
    return f"{stem}.tar", f"{stem}.index.npz", f"{stem}.idx"


def sample_bytes_estimate(meta: bytes, tokens: np.ndarray, images: list[EncodedImage],
                          videos: list[EncodedVideo] = ()) -> int:
    """Upper bound of the tar bytes one sample adds (headers and padding included)."""
    sizes = [len(meta), tokens.nbytes + 128] + [len(im.data) for im in images]
    sizes += [n for v in videos for n in (len(v.data), 64 + 24 * (len(v.info["frame_pts"]) + len(v.info["keyframes"])))]
    return sum(512 + (s + 511) // 512 * 512 for s in sizes)


class WdsPartWriter:
    """One WebDataset tar shard with its SampleIndex and DALI index."""

    def __init__(self, root: str, stem: str, image_token_id: int, storage_options: dict | None = None,
                 fsync: bool = True, video_token_id: int | None = None):
        self.root = root
        self.fsync = fsync
        self.stem = stem
        self.storage_options = storage_options or {}
        self.image_token_id = image_token_id
        self.video_token_id = video_token_id
        self.tar_name, self.index_name, self.idx_name = shard_names(stem)
        self._file = fsutil.AtomicLocalFile(fsutil.join(root, self.tar_name), self.storage_options, fsync)
        self._crc = CrcFile(self._file.file)
        self._tar = _RecordingTar(self._crc)
        self._builder = IndexBuilder()
        self._samples: list[list[Member]] = []

    @property
    def offset(self) -> int:
        return self._tar.offset

    def __len__(self) -> int:
        return len(self._builder)

    def add(self, key: str, meta: dict, tokens: np.ndarray, images: list[EncodedImage],
            videos: list[EncodedVideo] = ()) -> None:
        first = len(self._tar.members)
        write_sample(self._tar, self._builder, key, meta, tokens, images, self.image_token_id, videos,
                     self.video_token_id)
        self._samples.append(self._tar.members[first:])

    def close(self) -> ShardInfo:
        """Finish the tar, publish it, then its index files; returns its ShardInfo."""
        self._tar.close()
        self._crc.flush()
        index = self._builder.build().describes(self._crc.size, self._crc.crc & 0xFFFFFFFF)
        self._file.commit()
        fsutil.atomic_write_bytes(fsutil.join(self.root, self.index_name), index.to_bytes(), self.storage_options,
                                  self.fsync)
        fsutil.atomic_write_bytes(fsutil.join(self.root, self.idx_name), format_index(self._samples),
                                  self.storage_options, self.fsync)
        return ShardInfo(name=self.tar_name, index=self.index_name, samples=len(index),
                         images=index.n_image_total, bytes=self._crc.size, crc32=self._crc.crc & 0xFFFFFFFF,
                         dali_index=self.idx_name, files=[self.tar_name])

    def abort(self) -> None:
        self._file.abort()
