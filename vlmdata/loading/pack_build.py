"""One pack from its samples' records: vectorised over the whole pack when it can be, else sample by sample.

`build_pack(records, images, cfg, stats, mode, videos)` returns the PackedBatch of `collate.py`
(`videos`: each record's decoded clips, `video.policy.DecodedVideo`, expanded on both paths).

The fast path (pack mode, no sample truncated, every sample's placeholders matching its images)
concatenates the samples' token arrays once, expands every image placeholder of the pack with
one `np.repeat`, computes labels and position ids for the whole pack, and writes them straight
into the pack's buffer: the same fields, value for value, as `prepare_sample` per sample and
then `collate_pack`, without a dozen small numpy calls per sample (on memmap shards, which need
no decode, those calls took about as much CPU as copying the pixels). Any other pack takes the
sample-by-sample path, which also counts and skips malformed samples.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from vlmdata.decode.tiled import sample_args
from vlmdata.errors import Skip
from vlmdata.loading.collate import (
    IGNORE,
    CollateConfig,
    DecodedPixels,
    PreparedSample,
    collate_bucket,
    collate_pack,
    placeholder_starts,
    prepare_sample,
    write_expansions,
)
from vlmdata.loading.shared_pack import PackedBatch, PackWriter
from vlmdata.loading.video_pack import (
    declare_videos,
    fill_videos,
    images_before_clips,
    video_mask,
    video_repeats,
    write_video_expansions,
)
from vlmdata.metrics.counts import StatsDelta

__all__ = ["PackTokens", "build_pack", "layout_pack", "truncated_pack"]

log = logging.getLogger(__name__)


def _cumsum0(x: np.ndarray) -> np.ndarray:
    out = np.zeros(len(x) + 1, np.int64)
    np.cumsum(x, out=out[1:])
    return out


@dataclass
class PackTokens:
    """A pack's samples as arrays: what the whole-pack layout needs of them, from any reader."""

    keys: list[str]
    ids: np.ndarray             # int, every sample's token ids concatenated
    loss: np.ndarray            # loss flags, same layout
    lens: np.ndarray            # int64 [n] tokens per sample
    image_counts: np.ndarray    # int64 [n] images per sample
    widths: np.ndarray          # int64 [images] stored width of each image, in pack order
    heights: np.ndarray         # int64 [images]
    clip_counts: np.ndarray     # int64 [n] video clips per sample


def layout_pack(t: PackTokens, cfg: CollateConfig, stats: StatsDelta, pixels, clips: list = ()) -> PackedBatch | None:
    """The pack of `t` laid out at once, its images written by `pixels` (`declare(out)`, then `fill(arrays)`,
    False when the pixels cannot be trusted); None when a sample needs the per-sample path (placeholders
    not matching its images or clips, a sample to truncate) or `fill` returned False. `stats` counts only
    a pack returned."""
    tok_cu = _cumsum0(t.lens)
    ids = t.ids.astype(np.int64, copy=False)
    is_img = ids == cfg.image_token_id
    placeholders = _cumsum0(is_img)[tok_cu]
    per_sample = np.diff(placeholders)
    if not np.array_equal(per_sample, t.image_counts) or len(t.widths) != int(placeholders[-1]):
        return None
    is_vid = video_mask(ids, cfg.video_token_id)
    if not np.array_equal(np.diff(_cumsum0(is_vid)[tok_cu]), t.clip_counts):
        return None
    repeats = np.ones(len(ids), np.int64)
    repeats[is_vid] = video_repeats(list(clips))
    counts = np.repeat(per_sample, per_sample)          # the image count of each image's sample
    sizes = list(zip(t.widths.tolist(), t.heights.tolist()))
    if sizes:
        extra = sample_args(cfg.policy, counts)
        repeats[is_img] = np.asarray(cfg.policy.tokens(t.widths, t.heights, *extra), np.int64).reshape(-1)
    exp_cu = _cumsum0(repeats)[tok_cu]
    exp_lens = np.diff(exp_cu)
    if (exp_lens > cfg.max_tokens).any():
        return None                                  # truncation: the per-sample path cuts those samples
    total = int(exp_cu[-1])
    out = PackWriter()
    for name in ("input_ids", "labels", "position_ids"):
        out.add(name, np.int64, (total,))
    out.add("cu_seqlens", np.int32, (len(exp_cu),))
    pixels.declare(out)
    declare_videos(out, list(clips), t.clip_counts)
    a = out.allocate()
    a["input_ids"][:] = np.repeat(ids, repeats)
    write_expansions(a["input_ids"], placeholder_starts(repeats, is_img), sizes, cfg.policy, counts)
    write_video_expansions(a["input_ids"], repeats, is_vid, list(clips))
    a["labels"][:] = np.repeat(np.where((t.loss > 0) & ~is_img & ~is_vid, ids, IGNORE), repeats)
    a["labels"][exp_cu[:-1][exp_lens > 0]] = IGNORE          # each sample's first token predicts nothing
    np.subtract(np.arange(total, dtype=np.int64), np.repeat(exp_cu[:-1], exp_lens), out=a["position_ids"])
    a["cu_seqlens"][:] = exp_cu
    fill_videos(a, list(clips), t.clip_counts, images_before_clips(is_img, is_vid))
    if not pixels.fill(a):
        return None
    batch = out.finish({"max_seqlen": int(exp_lens.max()), "sample_keys": list(t.keys)})
    stats.samples += len(t.keys)
    stats.images += len(sizes)
    stats.real_tokens += total
    stats.packs += 1
    return batch


def truncated_pack(t: PackTokens, cfg: CollateConfig, stats: StatsDelta, pixels_for) -> PackedBatch | None:
    """The pack of `t` sample by sample (`prepare_sample`: truncation at max_tokens), its pixels written by
    `pixels_for(images)` (the pack's images kept, as their places in `t`): what the per-sample path makes of
    the same samples. None when a sample's placeholders do not match its images or the pixels cannot be
    trusted (the per-sample path then counts that sample); `stats` counts only a pack returned."""
    tok_cu, img_cu = _cumsum0(t.lens).tolist(), _cumsum0(t.image_counts).tolist()
    local, prepared = StatsDelta(), []
    for k, key in enumerate(t.keys):
        a, b = tok_cu[k], tok_cu[k + 1]
        tokens = np.stack([t.ids[a:b], t.loss[a:b]]).astype(np.int32, copy=False)
        images = list(range(img_cu[k], img_cu[k + 1]))
        sizes = list(zip(t.widths[images].tolist(), t.heights[images].tolist()))
        try:
            sample, truncated = prepare_sample(key, tokens, images, sizes, cfg)
        except ValueError:
            return None
        local.truncated += int(truncated)
        prepared.append(sample)
    batch = collate_pack(prepared, cfg, local, pixels_for([i for s in prepared for i in s.images]))
    if batch is not None:
        stats.merge(local)
    return batch


def _fast_pack(records: list, images: list[list], cfg: CollateConfig, stats: StatsDelta,
               videos: list[list] | None = None) -> PackedBatch | None:
    """The whole pack at once, or None when a sample needs the per-sample path."""
    videos = videos if videos is not None else [[] for _ in records]
    toks = [r.tokens for r in records]
    sizes = [sz for r in records for sz in r.sizes]
    t = PackTokens(keys=[r.key for r in records], ids=np.concatenate([t[0] for t in toks]),
                   loss=np.concatenate([t[1] for t in toks]),
                   lens=np.fromiter((t.shape[1] for t in toks), np.int64, len(toks)),
                   image_counts=np.fromiter(map(len, images), np.int64, len(images)),
                   widths=np.fromiter((w for w, _ in sizes), np.int64, len(sizes)),
                   heights=np.fromiter((h for _, h in sizes), np.int64, len(sizes)),
                   clip_counts=np.fromiter(map(len, videos), np.int64, len(videos)))
    parts = [PreparedSample(r.key, None, None, ims, list(r.sizes), vs) for r, ims, vs in zip(records, images, videos)]
    return layout_pack(t, cfg, stats, DecodedPixels(parts, cfg), [v for vs in videos for v in vs])


def build_pack(records: list, images: list[list | None], cfg: CollateConfig, stats: StatsDelta,
               mode: str = "pack", videos: list[list] | None = None) -> PackedBatch:
    """The pack of `records` (SampleRecord) with their decoded `images` (None = the sample was skipped) and
    decoded `videos` (None: no record has clips)."""
    videos = videos if videos is not None else [[] for _ in records]
    if mode == "pack":
        kept = [(r, ims, vs) for r, ims, vs in zip(records, images, videos) if ims is not None]
        if kept:
            fast = _fast_pack([k[0] for k in kept], [k[1] for k in kept], cfg, stats, [k[2] for k in kept])
            if fast is not None:
                return fast
    prepared: list[PreparedSample] = []
    for rec, ims, vs in zip(records, images, videos):
        if ims is None:
            continue
        try:
            sample, truncated = prepare_sample(rec.key, rec.tokens, ims, rec.sizes, cfg, vs)
        except ValueError as exc:
            log.warning("skipping sample %s: %s", rec.key, exc)
            stats.skipped[Skip.BAD_SAMPLE] += 1
            continue
        stats.truncated += int(truncated)
        prepared.append(sample)
    collate = collate_pack if mode == "pack" else collate_bucket
    return collate(prepared, cfg, stats)
