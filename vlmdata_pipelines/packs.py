"""Pack manipulation for tests and benchmarks: split a pack into its samples, concatenate
packs, lay samples out as padded rows, build a synthetic pack without a dataset, and take
a whole epoch's packs (or an even spread of them) from a dataset.

All helpers work on PackedBatch dicts (see docs/architecture.md) on the CPU.
"""
from __future__ import annotations

import torch

from vlmdata_pipelines.model import IGNORE, image_grids

_TENSOR_KEYS = ("input_ids", "labels", "position_ids")


def image_token_counts(batch: dict, patch: int, merge: int) -> list[int]:
    """LM tokens taken by each image of the pack, in order."""
    pixels = batch.get("pixel_values")
    if pixels is None or pixels.shape[0] == 0:
        return []
    if pixels.dim() == 4:
        side_h, side_w = pixels.shape[2] // patch, pixels.shape[3] // patch
        return [side_h * side_w // (merge * merge)] * pixels.shape[0]
    return [r * c // (merge * merge) for r, c in image_grids(batch).tolist()]


def _select_images(batch: dict, first: int, count: int) -> dict:
    """The image fields of `batch` restricted to images [first, first+count)."""
    pixels = batch.get("pixel_values")
    if pixels is None:
        return {}
    if pixels.dim() == 4:
        return {"pixel_values": pixels[first:first + count]}
    grid_rc = image_grids(batch)
    grids = batch["image_grid"].reshape(grid_rc.shape[0], -1)
    sizes = (grid_rc[:, 0] * grid_rc[:, 1]).tolist()
    start = sum(sizes[:first])
    n = sum(sizes[first:first + count])
    sub_sizes = torch.tensor([0] + sizes[first:first + count], dtype=torch.int64).cumsum(0).to(torch.int32)
    return {"pixel_values": pixels[start:start + n], "image_grid": grids[first:first + count],
            "vision_cu_seqlens": sub_sizes}


def split_pack(batch: dict, image_token_id: int, patch: int, merge: int) -> list[dict]:
    """One single-sample PackedBatch per sample of `batch` (images split accordingly)."""
    bounds = batch["cu_seqlens"].tolist()
    per_image = image_token_counts(batch, patch, merge)
    out, next_image = [], 0
    for a, b in zip(bounds[:-1], bounds[1:]):
        ids = batch["input_ids"][a:b]
        slots = int((ids == image_token_id).sum())
        count, taken = 0, 0
        while taken < slots:
            taken += per_image[next_image + count]
            count += 1
        if taken != slots:
            raise ValueError(f"sample at [{a}, {b}) has {slots} image tokens, not a whole number of images")
        one = {k: batch[k][a:b] for k in _TENSOR_KEYS}
        one.update(cu_seqlens=torch.tensor([0, b - a], dtype=torch.int32), max_seqlen=b - a)
        one.update(_select_images(batch, next_image, count))
        next_image += count
        out.append(one)
    return out


def concat_packs(packs: list[dict]) -> dict:
    """One pack holding all samples of `packs`, in order."""
    out = {k: torch.cat([p[k] for p in packs]) for k in _TENSOR_KEYS}
    cu, offset = [torch.zeros(1, dtype=torch.int32)], 0
    for p in packs:
        cu.append(p["cu_seqlens"][1:].to(torch.int32) + offset)
        offset += int(p["cu_seqlens"][-1])
    out["cu_seqlens"] = torch.cat(cu)
    out["max_seqlen"] = max(int(p["max_seqlen"]) for p in packs)
    with_pixels = [p for p in packs if p.get("pixel_values") is not None]
    if with_pixels:
        out["pixel_values"] = torch.cat([p["pixel_values"] for p in with_pixels])
        if with_pixels[0]["pixel_values"].dim() == 2:
            out["image_grid"] = torch.cat([p["image_grid"] for p in with_pixels])
            rc = image_grids(out)
            sizes = rc[:, 0] * rc[:, 1]
            out["vision_cu_seqlens"] = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)]).to(torch.int32)
    return out


def pad_as_rows(batch: dict, pad_id: int) -> dict:
    """The same samples as equal-length rows padded to the longest (the padded-batch baseline).

    Expressed as a pack whose segments all have the longest length, so the very
    same model runs it: attention is one batched SDPA over [n, H, L, D]; pad
    tokens come after each row's real tokens (causal: they never affect them)
    and carry no label.
    """
    bounds = batch["cu_seqlens"].tolist()
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    longest = max(lengths)
    rows = {k: [] for k in _TENSOR_KEYS}
    fill = {"input_ids": pad_id, "labels": IGNORE}
    for a, n in zip(bounds[:-1], lengths):
        for k in _TENSOR_KEYS:
            seg = batch[k][a:a + n]
            if k == "position_ids":
                pad = torch.arange(n, longest, dtype=seg.dtype)
            else:
                pad = torch.full((longest - n,), fill[k], dtype=seg.dtype)
            rows[k].append(torch.cat([seg, pad]))
    out = {k: torch.cat(v) for k, v in rows.items()}
    out["cu_seqlens"] = torch.arange(len(lengths) + 1, dtype=torch.int32) * longest
    out["max_seqlen"] = longest
    for k in ("pixel_values", "image_grid", "vision_cu_seqlens"):
        if k in batch:
            out[k] = batch[k]
    return out


def synthetic_pack(lengths: list[int], images_per_sample: list[int], cfg, image_size: int,
                   seed: int = 0) -> dict:
    """A random fixed-resolution pack (no dataset needed): BOS, images, text; loss on the text."""
    g = torch.Generator().manual_seed(seed)
    tok_per_image = (image_size // cfg.patch) ** 2 // (cfg.merge * cfg.merge)
    ids, labels, pos, cu = [], [], [], [0]
    for n, k in zip(lengths, images_per_sample):
        text = max(n - k * tok_per_image - 1, 2)
        sample = torch.cat([torch.tensor([256]), torch.full((k * tok_per_image,), cfg.image_token_id),
                            torch.randint(0, 256, (text,), generator=g)])
        lab = sample.clone()
        lab[0] = IGNORE
        lab[sample == cfg.image_token_id] = IGNORE
        ids.append(sample)
        labels.append(lab)
        pos.append(torch.arange(len(sample)))
        cu.append(cu[-1] + len(sample))
    n_img = sum(images_per_sample)
    pixels = torch.randint(0, 256, (n_img, 3, image_size, image_size), generator=g, dtype=torch.uint8)
    return {"input_ids": torch.cat(ids), "labels": torch.cat(labels), "position_ids": torch.cat(pos),
            "cu_seqlens": torch.tensor(cu, dtype=torch.int32), "max_seqlen": max(b - a for a, b in zip(cu, cu[1:])),
            "pixel_values": pixels}


def padded_rows(batch: dict, pad_id: int) -> dict:
    """The pack's samples as a bucket-mode batch: [B, L] rows padded to the longest, with attention_mask.

    The layout `VLMDataset(mode="bucket")` yields (and Hugging Face's padded path takes): real tokens
    first in each row, then padding with label -100 and attention_mask 0; images unchanged (row order).
    """
    bounds = batch["cu_seqlens"].tolist()
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    rows, longest = len(lengths), max(lengths)
    out = {"input_ids": torch.full((rows, longest), pad_id, dtype=torch.int64),
           "labels": torch.full((rows, longest), IGNORE, dtype=torch.int64),
           "attention_mask": torch.zeros((rows, longest), dtype=torch.int64),
           "position_ids": torch.zeros((rows, longest), dtype=torch.int64),
           "lengths": torch.tensor(lengths, dtype=torch.int32), "max_seqlen": longest}
    for i, (a, n) in enumerate(zip(bounds[:-1], lengths)):
        out["input_ids"][i, :n] = batch["input_ids"][a:a + n]
        out["labels"][i, :n] = batch["labels"][a:a + n]
        out["attention_mask"][i, :n] = 1
        out["position_ids"][i, :n] = torch.arange(n)
    for k in ("pixel_values", "image_grid", "vision_cu_seqlens"):
        if k in batch:
            out[k] = batch[k]
    return out


def epoch_packs(data: str, max_tokens: int, policy) -> list[dict]:
    """Every non-empty pack of epoch 0 of the dataset at `data` (one rank, in order, Pillow decode)."""
    from vlmdata.loading import VLMDataset

    ds = VLMDataset(data, seed=0, max_tokens=max_tokens, image_size=policy, rank=0, world_size=1,
                    decoder="pillow")
    ds.set_epoch(0)
    return [b for b in ds if b["sample_keys"]]


def spread(items: list, count: int) -> list:
    """`count` items evenly spaced over the list (a representative sample of the epoch)."""
    if count >= len(items):
        return list(items)
    step = len(items) / count
    return [items[int(i * step)] for i in range(count)]
