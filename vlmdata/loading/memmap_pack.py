"""A memmap pack read whole: every sample's tokens and pixels located in numpy, pixels read straight into the pack.

The per-sample path reads a memmap sample as a SampleRecord (its token arrays, one array per image),
copies it out of the map (`SampleRecord.detached`), checks that the shard was not rewritten in place,
and collate then copies each image again, into the pack's buffer: two copies of every pixel and a
dozen Python objects per sample. `read_memmap_pack` does the same work per pack:

- which samples to skip, from the index in numpy: rows outside the shard's arrays (`memmap_bad_rows`)
  and image rows that belong to another sample (the owner tags, `formats.memmap`), counted as
  index_mismatch like the per-sample path counts them; samples of an unreadable shard by its reason;
- the kept samples' tokens gathered with one fancy index per shard, their image rows and stored sizes
  too; the layout of `pack_build.layout_pack` (the same fields, value for value);
- the pixels: each run of consecutive image rows of a shard copied with one `pread` from the shard's
  file straight into the pack's `pixel_values` (`MappedShard.read_into`: the kernel copies from the
  page cache, no page of the map is touched, so the worker's memory does not grow by the shards it
  reads), or with one numpy copy from a shard held in memory (a cache's buffer);
- then, once per shard of the pack, the in-place rewrite check (`MappedShard.changed`).

A pack it cannot take returns None and goes the per-sample way (the caller's fallback), which then
skips and counts what it must: a pack mode other than "pack", a pixel layout other than the fixed one,
a shard that is not memmap, a sample to truncate or whose placeholders do not match its images, an
index whose image columns disagree, a shard rewritten in place (the per-sample path skips its samples
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
from vlmdata.loading.pack_build import PackTokens, layout_pack
from vlmdata.loading.shared_pack import PackedBatch, PackWriter
from vlmdata.metrics.counts import StatsDelta

__all__ = ["MemmapReader", "fixed_pixels", "read_memmap_pack"]

log = logging.getLogger(__name__)


class MemmapReader:
    """A memmap shard's reader: `reader(i)` is sample i's SampleRecord (the per-sample path, `read`);
    `shard` and `mapped` (the MappedShard of a local file, else None) serve `read_memmap_pack`."""

    def __init__(self, read: Callable[[int], SampleRecord], shard: MemmapShard, mapped: MappedShard | None):
        self.read, self.shard, self.mapped = read, shard, mapped

    def __call__(self, i: int) -> SampleRecord:
        return self.read(i)

    def mismatched(self, rows: np.ndarray) -> np.ndarray:
        """Per row: True when its tokens, meta or images lie outside the shard or an image row is another
        sample's (what `MemmapShard.read_sample` raises IndexMismatchError for)."""
        shard, ix = self.shard, self.shard.index
        bad = shard.bad_rows[rows] if shard.bad_rows is not None else np.zeros(len(rows), bool)
        if shard.owners is None:
            return bad
        counts = np.where(bad, 0, ix.n_images[rows]).astype(np.int64)
        image_rows = ix.img_offset[ranges(ix.image_start[rows], counts)]
        keys = ix.key[rows].tolist()
        want = np.fromiter((owner_tag(k, j) for k, c in zip(keys, counts.tolist()) for j in range(c)), np.uint64,
                           len(image_rows))
        wrong = shard.owners[image_rows] != want
        bad[np.repeat(np.arange(len(rows)), counts)[wrong]] = True
        return bad

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
    """The pack's pixel_values, read run by run from the shards (see the module docstring)."""

    def __init__(self, readers: list[MemmapReader], group: np.ndarray, rows: np.ndarray, size: int):
        self.readers, self.group, self.rows, self.size = readers, group, rows, size

    def declare(self, out: PackWriter) -> None:
        declare_fixed_pixels(out, len(self.rows), self.size)

    def fill(self, arrays: dict) -> bool:
        pixels, group, rows = arrays["pixel_values"], self.group, self.rows
        cut = np.flatnonzero((group[1:] != group[:-1]) | (rows[1:] != rows[:-1] + 1)) + 1
        bounds = [0, *cut.tolist(), len(rows)] if len(rows) else []
        for a, b in zip(bounds, bounds[1:]):
            if not self.readers[group[a]].copy_rows(pixels[a:b], int(rows[a])):
                return False
        return not any(r.changed() for r in self.readers)     # after the copies: were they the checked bytes?


def read_memmap_pack(readers: dict, shards: np.ndarray, rows: np.ndarray, gids: np.ndarray, cfg: CollateConfig,
                     stats: StatsDelta) -> PackedBatch | None:
    """The pack of samples `gids` (shard `shards[k]`, row `rows[k]`; `readers`: shard -> MemmapReader or a
    Skip reason), or None for the per-sample path (see the module docstring); `stats` counts a pack returned."""
    if not fixed_pixels(cfg) or not all(isinstance(r, (MemmapReader, str)) for r in readers.values()):
        return None
    skipped, mismatched = Counter(), []
    keep = np.ones(len(gids), bool)
    used: list[MemmapReader] = []
    where = np.empty(len(gids), np.int64)                  # each sample's reader, as its place in `used`
    for s, reader in readers.items():
        at = np.flatnonzero(shards == s)
        if isinstance(reader, str):
            skipped[reader] += len(at)
            keep[at] = False
            continue
        ix = reader.shard.index
        if reader.shard.image_size != cfg.policy.size or not _image_columns_agree(ix):
            return None
        bad = reader.mismatched(rows[at])
        keep[at[bad]] = False
        mismatched += gids[at[bad]].tolist()
        where[at] = len(used)
        used.append(reader)
    kept = np.flatnonzero(keep)
    if not len(kept):
        return None
    try:
        t, image_group, image_rows = _gather(used, where[kept], rows[kept])
    except UnicodeDecodeError:                             # a key that is not UTF-8: the per-sample path counts it
        return None
    local = StatsDelta()
    batch = layout_pack(t, cfg, local, _ShardPixels(used, image_group, image_rows, cfg.policy.size))
    if batch is None:
        return None
    for gid in sorted(mismatched):
        log.warning("skipping sample %d: its index row points outside the memmap shard or at another sample's "
                    "image row", gid)
    local.skipped.update(skipped)
    if mismatched:
        local.skipped[Skip.INDEX_MISMATCH] += len(mismatched)
    stats.merge(local)
    return batch


def _image_columns_agree(ix) -> bool:
    """True when every sample's image rows lie inside the index's per-image columns."""
    return bool(((ix.image_start >= 0) & (ix.image_start + ix.n_images <= len(ix.img_offset))).all())


def _gather(readers: list[MemmapReader], where: np.ndarray, rows: np.ndarray):
    """The kept samples' PackTokens, and per image of the pack its reader (place in `readers`) and row."""
    n = len(rows)
    lens, counts = np.empty(n, np.int64), np.empty(n, np.int64)
    for g, r in enumerate(readers):
        sel = where == g
        lens[sel] = r.shard.index.tok_size[rows[sel]]
        counts[sel] = r.shard.index.n_images[rows[sel]]
    tok_cu, img_cu = np.cumsum(lens) - lens, np.cumsum(counts) - counts
    ids, loss = np.empty(int(lens.sum()), np.int32), np.empty(int(lens.sum()), np.uint8)
    m = int(counts.sum())
    group, image_rows, widths, heights = (np.empty(m, np.int64) for _ in range(4))
    keys = np.empty(n, object)
    for g, r in enumerate(readers):
        sel = np.flatnonzero(where == g)
        if not len(sel):
            continue
        ix, shard, rs = r.shard.index, r.shard, rows[sel]
        dst, src = ranges(tok_cu[sel], lens[sel]), ranges(ix.tok_offset[rs], lens[sel])
        ids[dst], loss[dst] = shard.ids[src], shard.loss[src]
        dst, src = ranges(img_cu[sel], counts[sel]), ranges(ix.image_start[rs], counts[sel])
        group[dst], image_rows[dst] = g, ix.img_offset[src]
        widths[dst], heights[dst] = ix.width[src], ix.height[src]
        keys[sel] = [k.decode("utf-8") for k in ix.key[rs].tolist()]
    t = PackTokens(keys=keys.tolist(), ids=ids, loss=loss, lens=lens, image_counts=counts, widths=widths,
                   heights=heights, clip_counts=np.zeros(n, np.int64))
    return t, group, image_rows
