"""PackedBatch: turning the samples of a pack (or a bucket) into the tensors a training step takes.

Pack mode (see docs/architecture.md, PackedBatch):
    input_ids     int64 [T]   image placeholders expanded to the policy's tokens per image
    labels        int64 [T]   token id where the loss applies, else -100 (image tokens, prompts,
                              user turns, each sample's first token); the model shifts (HF convention)
    position_ids  int64 [T]   restart at 0 for every sample
    cu_seqlens    int32 [n+1] sample boundaries; max_seqlen int
    pixel_values  uint8 [n_img, 3, S, S]              fixed policy
                  uint8 [patches, 3 * patch * patch]  dynamic policy, with image_grid int32 [n_img, 3]
                                                      (t, h, w) and vision_cu_seqlens int32 [n_img + 1]
    image_bytes / image_sizes                         instead of pixels when decode is deferred (GPU decode),
                  image_counts int32 [n]              with images per sample (one per cu_seqlens segment / row)
    sample_keys   list[str];  state dict;  stats dict (metrics.StatsDelta)
Bucket mode: the same fields padded to [B, L] plus attention_mask, without cu_seqlens.

A sample longer than max_tokens is cut at its tail, never inside an image:
a cut that would split an image moves before it, and images after the cut
are left out with the text after them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from vlmdata.decode.patches import pack_patches
from vlmdata.decode.policy import DynamicPolicy, ImagePolicy
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


@dataclass
class CollateConfig:
    """What collate needs to know."""

    policy: ImagePolicy
    image_token_id: int
    pad_token_id: int
    max_tokens: int
    defer_decode: bool = False
    extra: dict = field(default_factory=dict)


def prepare_sample(key: str, tokens: np.ndarray, images: list, sizes: list[tuple[int, int]],
                   cfg: CollateConfig) -> tuple[PreparedSample, bool]:
    """Expand image placeholders, build labels, truncate to max_tokens; returns (sample, truncated)."""
    ids = tokens[0].astype(np.int64)
    loss = tokens[1]
    is_img = ids == cfg.image_token_id
    n_img = int(is_img.sum())
    if n_img != len(images):
        raise ValueError(f"sample {key}: {n_img} image placeholders for {len(images)} images")
    per_image = np.asarray(cfg.policy.tokens(np.asarray([w for w, _ in sizes]), np.asarray([h for _, h in sizes])),
                           dtype=np.int64).reshape(-1)
    repeats = np.ones(len(ids), dtype=np.int64)
    repeats[is_img] = per_image
    total = int(repeats.sum())
    truncated = total > cfg.max_tokens
    if truncated:
        ends = np.cumsum(repeats)
        starts = ends - repeats
        cut = cfg.max_tokens
        inside = is_img & (starts < cut) & (ends > cut)
        if inside.any():
            cut = int(starts[inside][0])
        keep_positions = int(np.searchsorted(ends, cut, side="right"))   # placeholders fully before the cut
        ids, loss, repeats = ids[:keep_positions], loss[:keep_positions], repeats[:keep_positions]
        n_keep = int((ids == cfg.image_token_id).sum())
        images, sizes = images[:n_keep], sizes[:n_keep]
    exp_ids = np.repeat(ids, repeats)
    exp_loss = np.repeat(loss, repeats)
    labels = np.where((exp_loss > 0) & (exp_ids != cfg.image_token_id), exp_ids, IGNORE)
    if len(labels):
        labels[0] = IGNORE
    return PreparedSample(key, exp_ids, labels, list(images), list(sizes)), truncated


def _images_out(parts: list[PreparedSample], cfg: CollateConfig) -> dict:
    images = [im for s in parts for im in s.images]
    sizes = [sz for s in parts for sz in s.sizes]
    if cfg.defer_decode:
        return {"image_bytes": [bytes(im) for im in images],
                "image_sizes": torch.tensor(sizes, dtype=torch.int32).reshape(-1, 2),
                "image_counts": torch.tensor([len(s.images) for s in parts], dtype=torch.int32)}
    policy = cfg.policy
    if isinstance(policy, DynamicPolicy):
        patches, grid, cu = pack_patches(images, policy.patch, policy.merge)
        return {"pixel_values": torch.from_numpy(patches), "image_grid": torch.from_numpy(grid),
                "vision_cu_seqlens": torch.from_numpy(cu)}
    s = policy.size
    pixels = np.empty((len(images), 3, s, s), np.uint8)
    for i, im in enumerate(images):                 # HWC -> CHW, one copy per image
        pixels[i] = im.transpose(2, 0, 1)
    return {"pixel_values": torch.from_numpy(pixels)}


def _empty(cfg: CollateConfig) -> PreparedSample:
    return PreparedSample("", np.asarray([cfg.pad_token_id], np.int64), np.asarray([IGNORE], np.int64), [], [])


def collate_pack(samples: list[PreparedSample], cfg: CollateConfig, stats: StatsDelta) -> dict:
    """One packed sequence (see module docstring). An empty pack holds one padding token."""
    real = bool(samples)
    parts = samples if real else [_empty(cfg)]
    lengths = np.asarray([len(s.ids) for s in parts], dtype=np.int64)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    position_ids = np.arange(int(cu[-1]), dtype=np.int64) - np.repeat(cu[:-1].astype(np.int64), lengths)
    batch = {
        "input_ids": torch.from_numpy(np.concatenate([s.ids for s in parts])),
        "labels": torch.from_numpy(np.concatenate([s.labels for s in parts])),
        "position_ids": torch.from_numpy(position_ids),
        "cu_seqlens": torch.from_numpy(cu),
        "max_seqlen": int(lengths.max()),
        "sample_keys": [s.key for s in samples],
    }
    batch.update(_images_out(parts, cfg))
    stats.samples += len(samples)
    stats.images += sum(len(s.images) for s in samples)
    stats.real_tokens += int(lengths.sum()) if real else 0
    stats.padded_tokens += 0 if real else 1
    stats.packs += 1
    return batch


def collate_bucket(samples: list[PreparedSample], cfg: CollateConfig, stats: StatsDelta) -> dict:
    """Samples padded to the longest: [B, L] tensors plus attention_mask."""
    real = bool(samples)
    parts = samples if real else [_empty(cfg)]
    lengths = np.asarray([len(s.ids) for s in parts], dtype=np.int64)
    b, longest = len(parts), int(lengths.max())
    ids = np.full((b, longest), cfg.pad_token_id, np.int64)
    labels = np.full((b, longest), IGNORE, np.int64)
    mask = np.zeros((b, longest), np.int64)
    pos = np.zeros((b, longest), np.int64)
    for i, s in enumerate(parts):
        n = len(s.ids)
        ids[i, :n] = s.ids
        labels[i, :n] = s.labels
        mask[i, :n] = 1 if real else 0
        pos[i, :n] = np.arange(n)
    batch = {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels),
             "attention_mask": torch.from_numpy(mask), "position_ids": torch.from_numpy(pos),
             "lengths": torch.from_numpy(lengths.astype(np.int32)), "max_seqlen": longest,
             "sample_keys": [s.key for s in samples]}
    batch.update(_images_out(parts, cfg))
    stats.samples += len(samples)
    stats.images += sum(len(s.images) for s in samples)
    stats.real_tokens += int(lengths.sum()) if real else 0
    stats.padded_tokens += b * longest - (int(lengths.sum()) if real else 0)
    stats.packs += 1
    return batch
