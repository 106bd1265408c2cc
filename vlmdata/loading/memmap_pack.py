"""A memmap pack read whole: every sample's tokens and pixels located in numpy, pixels read straight into the pack.

The per-sample path reads a memmap sample as a SampleRecord (its token arrays, one array per image),
copies it out of the map (`SampleRecord.detached`), checks that the shard was not rewritten in place,
and collate then copies each image again, into the pack's buffer: two copies of every pixel and a
dozen Python objects per sample. `read_memmap_pack` does the same work per pack:

- which samples to skip: each shard's rows are judged once, on the first pack read from it, in numpy
  (`unreadable_rows`: rows outside the shard's arrays, `memmap_bad_rows`, and image rows that belong to
  another sample, by the owner tags of `formats.memmap`), counted as index_mismatch like the per-sample
  path counts them; samples of an unreadable shard by its reason;
- the kept samples' token ranges and image rows looked up in the shard's index columns (as lists: a
  pack reads a few rows of each shard), the tokens concatenated once; the layout of
  `pack_build.layout_pack`, or of `pack_build.truncated_pack` when a sample is to be truncated (the
  same fields, value for value, as the per-sample path);
- the pixels: each run of consecutive image rows of a shard copied with one `pread` from the shard's
  file straight into the pack's `pixel_values` (`MappedShard.read_into`: the kernel copies from the
  page cache, no page of the map is touched, so the worker's memory does not grow by the shards it
  reads), or with one numpy copy from a shard held in memory (a cache's buffer);
- then, once per shard of the pack, the in-place rewrite check (`MappedShard.changed`).

A pack it cannot take returns None and goes the per-sample way (the caller's fallback), which then
skips and counts what it must: a pack mode other than "pack", a pixel layout other than the fixed one,
a shard that is not memmap, a sample whose placeholders do not match its images, an index whose image
columns disagree, a shard rewritten in place (the per-sample path skips its samples
as shard_changed), an empty pack. Nothing is counted or logged for a pack that falls back.
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import numpy as np

from vlmdata.cache.local_shards import MappedShard
from vlmdata.decode.policy import DynamicPolicy
from vlmdata.decode.tiled import is_tiled
from vlmdata.errors import Skip
from vlmdata.formats.index_checks import owner_tag
from vlmdata.formats.memmap import MemmapShard
from vlmdata.formats.sample import SampleRecord
from vlmdata.loading.collate import CollateConfig, declare_fixed_pixels
from vlmdata.loading.pack_build import PackTokens, layout_pack, truncated_pack
from vlmdata.loading.shared_pack import PackedBatch, PackWriter
from vlmdata.metrics.counts import StatsDelta

__all__ = ["MemmapReader", "fixed_pixels", "read_memmap_pack"]

log = logging.getLogger(__name__)


class MemmapReader:
    """A memmap shard's reader: `reader(i)` is sample i's SampleRecord (the per-sample path, `read`);
    `shard` and `mapped` (the MappedShard of a local file, else None) serve `read_memmap_pack`."""

    def __init__(self, read: Callable[[int], SampleRecord], shard: MemmapShard, mapped: MappedShard | None):
        self.read, self.shard, self.mapped = read, shard, mapped
        self._rows: _Rows | None = None

    def __call__(self, i: int) -> SampleRecord:
        return self.read(i)

    def rows(self) -> _Rows:
        """The shard's index as lists, with each row's verdict, made on the first pack read from it."""
        if self._rows is None:
            self._rows = _Rows(self.shard)
        return self._rows

    def copy_rows(self, dst: np.ndarray, first: int) -> bool:
        """Image rows first, first + 1, ... into dst (n, S, S, 3); False when the file got shorter."""
        if self.mapped is None:
            dst[:] = self.shard.images[first:first + len(dst)]
            return True
        offset = self.shard.images_offset + first * dst[0].nbytes
        return self.mapped.read_into(memoryview(dst.reshape(-1)), offset) == dst.nbytes

    def changed(self) -> bool:
        """True when the shard's file was rewritten in place since it was opened."""
        return self.mapped is not None and self.mapped.changed()


class _Rows:
    """A memmap shard's index columns as Python lists (a pack reads a few rows of each: list indexing is
    cheaper than numpy's per call), and which rows cannot be read (`unreadable`, see `unreadable_rows`)."""

    def __init__(self, shard: MemmapShard):
        ix = shard.index
        self.unreadable = unreadable_rows(shard).tolist()
        self.agree = bool(((ix.image_start >= 0) & (ix.image_start + ix.n_images <= len(ix.img_offset))).all())
        self.keys = ix.key.tolist()
        self.tok_offset, self.tok_size = ix.tok_offset.tolist(), ix.tok_size.tolist()
        self.image_start, self.n_images = ix.image_start.tolist(), ix.n_images.tolist()
        self.img_offset, self.width, self.height = ix.img_offset.tolist(), ix.width.tolist(), ix.height.tolist()


def unreadable_rows(shard: MemmapShard) -> np.ndarray:
    """Per index row: True when its tokens, meta or images lie outside the shard or one of its image rows
    is another sample's (what `MemmapShard.read_sample` raises IndexMismatchError for)."""
    ix = shard.index
    bad = shard.bad_rows.copy() if shard.bad_rows is not None else np.zeros(len(ix), bool)
    if shard.owners is None or not len(ix):
        return bad
    counts = np.where(bad, 0, ix.n_images).astype(np.int64)
    image_rows = ix.img_offset[ranges(ix.image_start, counts)]
    keys = ix.key.tolist()
    want = np.fromiter((owner_tag(k, j) for k, c in zip(keys, counts.tolist()) for j in range(c)), np.uint64,
                       len(image_rows))
    wrong = shard.owners[image_rows] != want
    bad[np.repeat(np.arange(len(ix)), counts)[wrong]] = True
    return bad


def ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The positions start, start + 1, ... (len of them) of every range, concatenated."""
    lens = np.asarray(lens, np.int64)
    total = int(lens.sum())
    ends = np.cumsum(lens)
    return np.arange(total, dtype=np.int64) + np.repeat(np.asarray(starts, np.int64) - (ends - lens), lens)


def fixed_pixels(cfg: CollateConfig) -> bool:
    """True when the pack's pixels are fixed-size images, one plain copy each (what memmap shards hold)."""
    p = cfg.policy
    return not (cfg.defer_decode or hasattr(p, "pixel_fields") or is_tiled(p) or isinstance(p, DynamicPolicy))


class _ShardPixels:
    """The pixel_values of some of the pack's images (`images`: their places in the pack; `readers[i]`,
    `rows[i]`: where image i is), read run by run of consecutive rows of one shard; then the in-place
    rewrite check of every shard in `sources` (all the pack's samples were read from, images or not)."""

    def __init__(self, readers: list[MemmapReader], rows: list[int], images, size: int, sources: list[MemmapReader]):
        self.size, self.n, self.sources = size, len(images), sources
        self.runs: list[list] = []                    # [reader, first row, count]
        for i in images:
            last = self.runs[-1] if self.runs else None
            if last is not None and last[0] is readers[i] and last[1] + last[2] == rows[i]:
                last[2] += 1
            else:
                self.runs.append([readers[i], rows[i], 1])

    def declare(self, out: PackWriter) -> None:
        declare_fixed_pixels(out, self.n, self.size)

    def fill(self, arrays: dict) -> bool:
        pixels, at = arrays["pixel_values"], 0
        for reader, first, count in self.runs:
            if not reader.copy_rows(pixels[at:at + count], first):
                return False
            at += count
        return not any(r.changed() for r in self.sources)    # after the copies: were they the checked bytes?


def read_memmap_pack(readers: dict, shards: np.ndarray, rows: np.ndarray, gids: np.ndarray, cfg: CollateConfig,
                     stats: StatsDelta) -> PackedBatch | None:
    """The pack of samples `gids` (shard `shards[k]`, row `rows[k]`; `readers`: shard -> MemmapReader or a
    Skip reason), or None for the per-sample path (see the module docstring); `stats` counts a pack returned."""
    if not fixed_pixels(cfg):
        return None
    skipped, mismatched, kept = Counter(), [], []
    for gid, s, row in zip(np.asarray(gids).tolist(), np.asarray(shards).tolist(), np.asarray(rows).tolist()):
        reader = readers[s]
        if isinstance(reader, str):
            skipped[reader] += 1
            continue
        if not isinstance(reader, MemmapReader) or reader.shard.image_size != cfg.policy.size:
            return None
        table = reader.rows()
        if not table.agree:
            return None
        if table.unreadable[row]:
            mismatched.append(gid)
        else:
            kept.append((reader, table, row))
    if not kept:
        return None
    try:
        t, image_readers, image_rows = _gather(kept)
    except UnicodeDecodeError:                             # a key that is not UTF-8: the per-sample path counts it
        return None

    sources = list({id(r): r for r, _, _ in kept}.values())

    def pixels_for(images) -> _ShardPixels:
        return _ShardPixels(image_readers, image_rows, images, cfg.policy.size, sources)

    local = StatsDelta()
    batch = layout_pack(t, cfg, local, pixels_for(range(len(image_rows))))
    if batch is None:                                      # a sample to truncate: prepared one by one
        batch = truncated_pack(t, cfg, local, pixels_for)
    if batch is None:
        return None
    for gid in mismatched:
        log.warning("skipping sample %d: its index row points outside the memmap shard or at another sample's "
                    "image row", gid)
    local.skipped.update(skipped)
    if mismatched:
        local.skipped[Skip.INDEX_MISMATCH] += len(mismatched)
    stats.merge(local)
    return batch


def _gather(kept: list[tuple]) -> tuple[PackTokens, list[MemmapReader], list[int]]:
    """The kept samples' PackTokens, and the reader and image row of each of the pack's images."""
    ids, loss, keys, lens, counts = [], [], [], [], []
    widths, heights, image_readers, image_rows = [], [], [], []
    for reader, table, row in kept:
        o, n = table.tok_offset[row], table.tok_size[row]
        ids.append(reader.shard.ids[o:o + n])
        loss.append(reader.shard.loss[o:o + n])
        keys.append(table.keys[row].decode("utf-8"))
        lens.append(n)
        a, c = table.image_start[row], table.n_images[row]
        counts.append(c)
        widths += table.width[a:a + c]
        heights += table.height[a:a + c]
        image_rows += table.img_offset[a:a + c]
        image_readers += [reader] * c
    t = PackTokens(keys=keys, ids=np.concatenate(ids), loss=np.concatenate(loss), lens=np.asarray(lens, np.int64),
                   image_counts=np.asarray(counts, np.int64), widths=np.asarray(widths, np.int64),
                   heights=np.asarray(heights, np.int64), clip_counts=np.zeros(len(kept), np.int64))
    return t, image_readers, image_rows
