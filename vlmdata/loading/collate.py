"""PackedBatch: turning the samples of a pack (or a bucket) into the tensors a training step takes.

Pack mode (see docs/architecture.md, PackedBatch):
    input_ids     int64 [T]   image placeholders expanded to the policy's tokens per image (a tiled
                              policy's structured sequence: decode.tiled)
    labels        int64 [T]   token id where the loss applies, else -100 (image tokens, prompts,
                              user turns, each sample's first token); the model shifts (HF convention)
    position_ids  int64 [T]   restart at 0 for every sample
    cu_seqlens    int32 [n+1] sample boundaries; max_seqlen int
    pixel_values  uint8 [n_img, 3, S, S]              fixed policy (channels_last memory format: NHWC in memory)
                  uint8 [patches, 3 * patch * patch]  dynamic policy, with image_grid int32 [n_img, 3]
                                                      (t, h, w) and vision_cu_seqlens int32 [n_img + 1]
                  uint8 [tiles, 3, S, S]              tiled policy (channels_last), with image_tiles int32
                                                      [n_img] (tiles per image) and image_sizes int32
                                                      [n_img, 2] (stored w, h)
                  any                                 a policy with `pixel_fields` (the processor policy):
                                                      the fields it names (the model's processor's outputs)
    image_bytes / image_sizes                         instead of pixels when decode is deferred (GPU decode):
                                                      list of uint8 arrays (encoded files), int32 [n, 2] (w, h),
                  image_counts int32 [n]              with images per sample (one per cu_seqlens segment / row)
    pixel_values_videos / video_grid / second_per_grid_ts / video_images_before   a pack holding clips
                                                      (loading.video_pack; deferred: video_bytes and the
                                                      frames each clip sampled)
    sample_keys   list[str];  state dict;  stats dict (metrics.StatsDelta)
Bucket mode: the same fields padded to [B, L] plus attention_mask, without cu_seqlens.

Every field is written once, into the buffer the pack crosses to the main process in
(`loading/shared_pack.py`: shared memory in a DataLoader worker, no further copy).

A sample longer than max_tokens is cut at its tail, never inside an image or a video:
a cut that would split one moves before it, and images and videos after the cut
are left out with the text after them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vlmdata.decode.patches import flatten_patches
from vlmdata.decode.policy import DynamicPolicy, ImagePolicy
from vlmdata.decode.tiled import is_tiled, sample_args
from vlmdata.loading.shared_pack import PackedBatch, PackWriter
from vlmdata.loading.video_pack import (
    declare_videos,
    fill_videos,
    images_before_clips,
    pack_images_before,
    video_mask,
    video_repeats,
    write_video_expansions,
)
from vlmdata.metrics.counts import StatsDelta

IGNORE = -100


@dataclass
class PreparedSample:
    """A sample ready to collate: expanded ids/labels and its images."""

    key: str
    ids: np.ndarray          # int64 [T] expanded
    labels: np.ndarray       # int64 [T]
    images: list             # decoded (H, W, 3) uint8 arrays, or encoded bytes when deferred
    sizes: list[tuple[int, int]]
    videos: list = field(default_factory=list)    # video.policy.DecodedVideo per clip, in order
    video_images_before: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # images before each


@dataclass
class CollateConfig:
    """What collate needs to know."""

    policy: ImagePolicy
    image_token_id: int
    pad_token_id: int
    max_tokens: int
    defer_decode: bool = False
    extra: dict = field(default_factory=dict)
    video_token_id: int | None = None       # set for a family that lays out videos
    video_policy: object = None             # video.policy.VideoPolicy


def prepare_sample(key: str, tokens: np.ndarray, images: list, sizes: list[tuple[int, int]],
                   cfg: CollateConfig, videos: list = ()) -> tuple[PreparedSample, bool]:
    """Expand image and video placeholders, build labels, truncate to max_tokens; returns (sample, truncated)."""
    ids = tokens[0].astype(np.int64)
    loss = tokens[1]
    is_img = ids == cfg.image_token_id
    n_img = int(is_img.sum())
    if n_img != len(images):
        raise ValueError(f"sample {key}: {n_img} image placeholders for {len(images)} images")
    counts = np.full(n_img, n_img, np.int64)                  # the image count of each image's sample
    extra = sample_args(cfg.policy, counts)
    ws, hs = np.asarray([w for w, _ in sizes]), np.asarray([h for _, h in sizes])
    per_image = np.asarray(cfg.policy.tokens(ws, hs, *extra), dtype=np.int64).reshape(-1)
    is_vid = video_mask(ids, cfg.video_token_id)
    if int(is_vid.sum()) != len(videos):
        raise ValueError(f"sample {key}: {int(is_vid.sum())} video placeholders for {len(videos)} videos")
    repeats = np.ones(len(ids), dtype=np.int64)
    repeats[is_img] = per_image
    repeats[is_vid] = video_repeats(list(videos))
    vision = is_img | is_vid
    total = int(repeats.sum())
    truncated = total > cfg.max_tokens
    if truncated:
        ends = np.cumsum(repeats)
        starts = ends - repeats
        cut = cfg.max_tokens
        inside = vision & (starts < cut) & (ends > cut)
        if inside.any():
            cut = int(starts[inside][0])
        fits = int((is_img & (ends <= cut)).sum())
        keep = cfg.policy.keep_images(n_img, fits) if extra else fits
        if keep < fits:                                      # the policy keeps fewer: cut before the next one
            cut = int(starts[is_img][keep])
        keep_positions = int(np.searchsorted(ends, cut, side="right"))   # placeholders fully before the cut
        ids, loss, repeats = ids[:keep_positions], loss[:keep_positions], repeats[:keep_positions]
        n_keep = int((ids == cfg.image_token_id).sum())
        images, sizes = images[:n_keep], sizes[:n_keep]
        videos = videos[:int(video_mask(ids, cfg.video_token_id).sum())]
    is_img, is_vid = ids == cfg.image_token_id, video_mask(ids, cfg.video_token_id)
    exp_ids = np.repeat(ids, repeats)
    labels = np.repeat(np.where((loss > 0) & ~is_img & ~is_vid, ids, IGNORE), repeats)
    write_expansions(exp_ids, placeholder_starts(repeats, is_img), sizes, cfg.policy, counts)
    write_video_expansions(exp_ids, repeats, is_vid, list(videos))
    if len(labels):
        labels[0] = IGNORE
    return PreparedSample(key, exp_ids, labels, list(images), list(sizes), list(videos),
                          images_before_clips(is_img, is_vid)), truncated


def placeholder_starts(repeats: np.ndarray, is_img: np.ndarray) -> np.ndarray:
    """Where each image placeholder's expansion starts in the expanded sequence."""
    ends = np.cumsum(repeats)
    return (ends - repeats)[is_img]


def write_expansions(exp_ids: np.ndarray, starts: np.ndarray, sizes, policy, counts=None) -> None:
    """Overwrite each image's run of placeholder ids with a tiled policy's token sequence (`<img>`,
    tile markers, newlines: `decode.tiled`); other policies' runs are the image token repeated.
    `counts`: the image count of each image's sample (for a per_sample policy)."""
    expansion = getattr(policy, "expansion", None)
    if expansion is None:
        return
    per_sample = getattr(policy, "per_sample", False)
    for i, (start, (w, h)) in enumerate(zip(starts.tolist(), sizes)):
        ids = expansion(w, h, int(counts[i])) if per_sample else expansion(w, h)
        exp_ids[start:start + len(ids)] = ids


def declare_images(out: PackWriter, parts: list[PreparedSample], cfg: CollateConfig) -> None:
    images = [im for s in parts for im in s.images]
    if cfg.defer_decode:
        out.add_bytes("image_bytes", [memoryview(im).nbytes for im in images])
        out.add("image_sizes", np.int32, (len(images), 2))
        out.add("image_counts", np.int32, (len(parts),))
        return
    policy = cfg.policy
    if hasattr(policy, "pixel_fields"):             # the policy lays out its own fields (decode.tiling.processor)
        for name, (dtype, shape) in policy.pixel_fields(images).items():
            out.add(name, dtype, shape)
        return
    if is_tiled(policy):
        s = policy.tile
        out.add("pixel_values", np.uint8, (sum(len(im) for im in images), s, s, 3), permute=(0, 3, 1, 2))
        out.add("image_tiles", np.int32, (len(images),))
        out.add("image_sizes", np.int32, (len(images), 2))
        return
    if isinstance(policy, DynamicPolicy):
        rows = sum((im.shape[0] // policy.patch) * (im.shape[1] // policy.patch) for im in images)
        out.add("pixel_values", np.uint8, (rows, 3 * policy.patch * policy.patch))
        out.add("image_grid", np.int32, (len(images), 3))
        out.add("vision_cu_seqlens", np.int32, (len(images) + 1,))
        return
    declare_fixed_pixels(out, len(images), policy.size)


def declare_fixed_pixels(out: PackWriter, n: int, size: int) -> None:
    """pixel_values of n images of size x size: (n, S, S, 3) in memory, handed out [n, 3, S, S] (channels_last)."""
    out.add("pixel_values", np.uint8, (n, size, size, 3), permute=(0, 3, 1, 2))


def fill_images(arrays: dict, parts: list[PreparedSample], cfg: CollateConfig) -> None:
    images = [im for s in parts for im in s.images]
    if cfg.defer_decode:
        for dst, im in zip(arrays["image_bytes"], images):
            dst[:] = np.frombuffer(im, np.uint8)
        arrays["image_sizes"][:] = np.asarray([sz for s in parts for sz in s.sizes], np.int32).reshape(-1, 2)
        arrays["image_counts"][:] = [len(s.images) for s in parts]
        return
    policy = cfg.policy
    if hasattr(policy, "pixel_fields"):
        policy.fill_pixel_fields(images, arrays)
        return
    if is_tiled(policy):
        pixels, at = arrays["pixel_values"], 0
        for i, im in enumerate(images):                 # (n, S, S, 3) tiles per image, in processor order
            pixels[at:at + len(im)] = im
            at += len(im)
            arrays["image_tiles"][i] = len(im)
        arrays["image_sizes"][:] = np.asarray([sz for s in parts for sz in s.sizes], np.int32).reshape(-1, 2)
        return
    if isinstance(policy, DynamicPolicy):
        p = policy.patch
        grid, cu, rows = arrays["image_grid"], arrays["vision_cu_seqlens"], arrays["pixel_values"]
        cu[0] = 0
        for i, im in enumerate(images):
            gh, gw = im.shape[0] // p, im.shape[1] // p
            grid[i] = (1, gh, gw)
            cu[i + 1] = cu[i] + gh * gw
            flatten_patches(im, p, policy.merge, out=rows[cu[i]:cu[i + 1]])
        return
    pixels = arrays["pixel_values"]
    for i, im in enumerate(images):                 # HWC into NHWC: one plain copy per image
        pixels[i] = im


def _empty(cfg: CollateConfig) -> PreparedSample:
    return PreparedSample("", np.asarray([cfg.pad_token_id], np.int64), np.asarray([IGNORE], np.int64), [], [])


class DecodedPixels:
    """A pack's pixels from the images its samples hold (declare_images / fill_images): what collate writes
    unless told otherwise. A pixel writer has `declare(out)` and `fill(arrays) -> bool` (False: the pixels
    cannot be trusted, the pack is dropped)."""

    def __init__(self, parts: list[PreparedSample], cfg: CollateConfig):
        self.parts, self.cfg = parts, cfg

    def declare(self, out: PackWriter) -> None:
        declare_images(out, self.parts, self.cfg)

    def fill(self, arrays: dict) -> bool:
        fill_images(arrays, self.parts, self.cfg)
        return True


def collate_pack(samples: list[PreparedSample], cfg: CollateConfig, stats: StatsDelta,
                 pixels=None) -> PackedBatch | None:
    """One packed sequence (see module docstring). An empty pack holds one padding token. `pixels`: the pixel
    writer (default: the samples' own images, `DecodedPixels`); None only when its `fill` returns False."""
    real = bool(samples)
    parts = samples if real else [_empty(cfg)]
    pixels = pixels if pixels is not None else DecodedPixels(parts, cfg)
    lengths = np.asarray([len(s.ids) for s in parts], dtype=np.int64)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    total = int(cu[-1])
    out = PackWriter()
    for name in ("input_ids", "labels", "position_ids"):
        out.add(name, np.int64, (total,))
    out.add("cu_seqlens", np.int32, (len(cu),))
    pixels.declare(out)
    declare_videos(out, [v for s in parts for v in s.videos], [len(s.videos) for s in parts])
    a = out.allocate()
    np.concatenate([s.ids for s in parts], out=a["input_ids"])
    np.concatenate([s.labels for s in parts], out=a["labels"])
    np.subtract(np.arange(total, dtype=np.int64), np.repeat(cu[:-1].astype(np.int64), lengths),
                out=a["position_ids"])
    a["cu_seqlens"][:] = cu
    clips = [v for s in parts for v in s.videos]
    fill_videos(a, clips, [len(s.videos) for s in parts], pack_images_before(parts))
    if not pixels.fill(a):
        return None
    batch = out.finish({"max_seqlen": int(lengths.max()), "sample_keys": [s.key for s in samples]})
    stats.samples += len(samples)
    stats.images += sum(len(s.images) for s in samples)
    stats.real_tokens += int(lengths.sum()) if real else 0
    stats.padded_tokens += 0 if real else 1
    stats.packs += 1
    return batch


def collate_bucket(samples: list[PreparedSample], cfg: CollateConfig, stats: StatsDelta) -> PackedBatch:
    """Samples padded to the longest: [B, L] tensors plus attention_mask."""
    real = bool(samples)
    parts = samples if real else [_empty(cfg)]
    lengths = np.asarray([len(s.ids) for s in parts], dtype=np.int64)
    b, longest = len(parts), int(lengths.max())
    out = PackWriter()
    for name in ("input_ids", "labels", "attention_mask", "position_ids"):
        out.add(name, np.int64, (b, longest))
    out.add("lengths", np.int32, (b,))
    declare_images(out, parts, cfg)
    declare_videos(out, [v for s in parts for v in s.videos], [len(s.videos) for s in parts])
    a = out.allocate()
    ids, labels, mask, pos = a["input_ids"], a["labels"], a["attention_mask"], a["position_ids"]
    ids[:] = cfg.pad_token_id
    labels[:] = IGNORE
    mask[:] = 0
    pos[:] = 0
    for i, s in enumerate(parts):
        n = len(s.ids)
        ids[i, :n] = s.ids
        labels[i, :n] = s.labels
        mask[i, :n] = 1 if real else 0
        pos[i, :n] = np.arange(n)
    a["lengths"][:] = lengths
    fill_images(a, parts, cfg)
    clips = [v for s in parts for v in s.videos]
    fill_videos(a, clips, [len(s.videos) for s in parts], pack_images_before(parts))
    batch = out.finish({"max_seqlen": longest, "sample_keys": [s.key for s in samples]})
    stats.samples += len(samples)
    stats.images += sum(len(s.images) for s in samples)
    stats.real_tokens += int(lengths.sum()) if real else 0
    stats.padded_tokens += b * longest - (int(lengths.sum()) if real else 0)
    stats.packs += 1
    return batch
