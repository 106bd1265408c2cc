"""References for the processor-exact pixel tests: transformers' PIL image processors on `load_image`'s image,
and vlmdata's decode + adapter layout of the same encoded bytes."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from tests.helpers.image_zoo import picture, save, zoo

# JPEG sizes from 64 to 1,344 px with extreme aspect ratios: smart_resize scales these up, down and rounds.
JPEG_SIZES = [(64, 64), (1344, 1008), (1344, 64), (64, 1344), (333, 500), (1000, 999), (97, 211), (800, 120)]


def sized_jpegs(seed: int = 0) -> dict[str, bytes]:
    """Textured JPEGs (a gradient plus noise, so every filter tap matters) of JPEG_SIZES."""
    rng = np.random.default_rng(seed)
    out = {}
    for w, h in JPEG_SIZES:
        base = np.asarray(Image.fromarray(picture()).resize((w, h), Image.Resampling.BILINEAR), np.int16)
        arr = np.clip(base + rng.integers(-40, 41, (h, w, 3)), 0, 255).astype(np.uint8)
        out[f"jpeg_{w}x{h}"] = save(Image.fromarray(arr), "JPEG", quality=90)
    return out


def hf_pixels(image_processor, data: bytes, **settings) -> dict:
    """The processor's output for one encoded image, opened as transformers' `load_image` opens it (`settings`:
    call keyword arguments, e.g. Gemma 3's pan-and-scan ones)."""
    from transformers.image_utils import load_image

    with Image.open(io.BytesIO(data)) as img:
        return image_processor(images=[load_image(img)], return_tensors="pt", **settings)


def processor_pixels(processor, data: bytes) -> dict:
    """The processor's own output (pixel_values, grids) for one encoded image opened as `load_image` opens it:
    the image processor with the processor's image defaults (InternVL's `crop_to_patches=True`)."""
    from transformers.image_utils import load_image

    with Image.open(io.BytesIO(data)) as img:
        out = processor(text=[processor.image_token], images=[load_image(img)], return_tensors="pt")
    return {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}


def qwen_rows(image: np.ndarray, spec) -> torch.Tensor:
    """vlmdata's decoded (H, W, 3) uint8 image as the Qwen adapter gives it to the model: normalised patch rows."""
    from vlmdata.decode import pack_patches
    from vlmdata.hf import qwen_patches

    rows, _, _ = pack_patches([image], spec.patch_size, spec.merge_size)
    return qwen_patches(torch.from_numpy(rows), spec.patch_size, spec.temporal_patch_size, spec.image_mean,
                        spec.image_std, torch.float32)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def shard_image_corpus(folder, tmp: Path) -> tuple[str, dict[str, list[bytes]]]:
    """`sized_jpegs` and awkward zoo files (EXIF-rotated, palette with transparency, CMYK), two per row, sharded
    with the model folder; returns (dataset root, sample key -> the original bytes of its images)."""
    raw = tmp / "raw"
    raw.mkdir()
    z = zoo()
    images = {**sized_jpegs(), **{k: z[k] for k in ("jpeg_exif_6", "jpeg_exif_5", "palette_png_trns", "cmyk_jpeg")}}
    for name, data in images.items():
        (raw / f"{name}.img").write_bytes(data)
    names = list(images)
    rows = []
    for i in range(0, len(names), 2):
        group = names[i:i + 2]
        content = [{"type": "image"} for _ in group] + [{"type": "text", "text": f"Describe picture {i}."}]
        rows.append({"id": f"s{i:02d}", "images": [f"{n}.img" for n in group],
                     "messages": [{"role": "user", "content": content},
                                  {"role": "assistant", "content": [{"type": "text", "text": "A picture."}]}]})
    (raw / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    from vlmdata import ShardConfig, shard_dataset

    shard_dataset(ShardConfig(inputs=[str(raw / "rows.jsonl")], output=str(tmp / "ds"), tokenizer=str(folder),
                              workers=0, max_samples_per_shard=3))
    return str(tmp / "ds"), {r["id"]: [images[n.removesuffix(".img")] for n in r["images"]] for r in rows}


def worst_pixel_diff(root: str, processor, by_key: dict, **options) -> tuple[float, int, str]:
    """(max abs difference of the loaded pixel_values from the processor's, samples seen, pixel mode) of a dataset
    made by `shard_image_corpus`, loaded with `options` through the family's adapter; grids must be equal too."""
    from vlmdata import DatasetOptions, VLMDataset
    from vlmdata.hf import ModelSpec, make_adapter, take_meta

    ds = VLMDataset(root, max_tokens=1 << 16, max_images=64, rank=0, world_size=1,
                    options=DatasetOptions(**options))
    adapter = make_adapter(ModelSpec.from_dataset(ds))
    worst, seen = 0.0, 0
    for batch in map(adapter, ds):
        keys = take_meta(batch)["sample_keys"]
        got = adapter.finalize(batch)
        refs = [processor_pixels(processor, data) for k in keys for data in by_key[k]]
        if "image_grid_thw" in refs[0]:
            assert torch.equal(got["image_grid_thw"], torch.cat([r["image_grid_thw"] for r in refs]))
        worst = max(worst, max_diff(got["pixel_values"], torch.cat([r["pixel_values"] for r in refs])))
        seen += len(keys)
    return worst, seen, ds.pixels


def tile_rows_diff(got: torch.Tensor, rows: list[torch.Tensor]) -> float:
    """Worst difference of per-image tile rows ([images, most tiles, 3, S, S], zero-padded) from the processor's
    rows (each zero-padded to its own batch's most tiles); past the shorter of the two both are padding only."""
    assert got.shape[0] == len(rows), (got.shape, len(rows))
    worst = 0.0
    for row, want in zip(got, rows):
        k = min(len(want), len(row))
        worst = max(worst, max_diff(row[:k], want[:k]))
        assert not row[k:].any() and not want[k:].any()
    return worst

