"""The shard gate follows the decoders: kept at shard time <=> stock Pillow decodes it, and the loader delivers it.

A real-world-like corpus is written at test time: many formats and modes Pillow opens, JPEG oddities Pillow
decodes (data after the end marker, a truncated APP segment, EXIF rotation, progressive, CMYK), and files it
cannot decode (a garbage body behind a valid header, a scan cut short, zero bytes, HTML, EPS without a program
to render it). Every kept file must come out of a real VLMDataset epoch with Pillow's pixels.
"""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image, ImageFile, ImageOps

from tests.helpers.image_zoo import exif_bytes, png16, save
from tests.helpers.shards import shard
from vlmdata.decode import DynamicPolicy, unflatten_patches
from vlmdata.loading import DatasetOptions, VLMDataset, make_loader

W, H = 64, 48
POLICY = DynamicPolicy(patch=16, merge=1, min_pixels=16 * 16, max_pixels=64 * 64)   # native size: no resize


def picture(w: int = W, h: int = H) -> Image.Image:
    y, x = np.mgrid[0:h, 0:w]
    arr = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x * 3 + y) % 256], -1).astype(np.uint8)
    arr[:8, :12] = (250, 250, 40)
    return Image.fromarray(arr)


def _scan_start(jpeg: bytes) -> int:
    sos = jpeg.index(b"\xff\xda")
    return sos + 2 + int.from_bytes(jpeg[sos + 2:sos + 4], "big")


def corpus() -> dict[str, bytes]:
    """name -> bytes: what real image folders hold, good and bad."""
    rgb = picture()
    jpeg = save(rgb, "JPEG", quality=90)
    frames = [rgb, Image.fromarray(255 - np.asarray(rgb))]
    noise = np.random.default_rng(0).integers(0, 256, len(jpeg) - _scan_start(jpeg), dtype=np.uint8).tobytes()
    return {
        "ppm": save(rgb, "PPM"), "pgm": save(rgb.convert("L"), "PPM"), "pbm": save(rgb.convert("1"), "PPM"),
        "ico": save(picture(64, 64), "ICO", sizes=[(64, 64)]), "bmp": save(rgb, "BMP"), "gif": save(rgb, "GIF"),
        "gif_animated": save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=40),
        "tiff": save(rgb, "TIFF", compression="tiff_lzw"), "webp": save(rgb, "WEBP", quality=90),
        "tga": save(rgb, "TGA"), "pcx": save(rgb, "PCX"),
        "png_palette": save(rgb.quantize(32), "PNG", transparency=0), "png_rgba": save(rgb.convert("RGBA"), "PNG"),
        "png_16bit": png16(np.asarray(rgb).astype(np.uint16) * 257),
        "jpeg": jpeg, "jpeg_cmyk": save(rgb.convert("CMYK"), "JPEG", quality=90),
        "jpeg_progressive": save(rgb, "JPEG", quality=90, progressive=True),
        "jpeg_exif_rotated": save(rgb, "JPEG", quality=90, exif=exif_bytes(6)),
        "jpeg_data_after_eoi": jpeg + b"\x00" * 6000,                       # e.g. a motion photo's trailer
        "jpeg_truncated_app14": jpeg[:2] + b"\xff\xee\x00\x07Adob" + jpeg[2:],
        "jpeg_no_eoi": jpeg[:-2],
        "jpeg_garbage_body": jpeg[:_scan_start(jpeg)] + noise,
        "jpeg_cut_mid_scan": jpeg[:int(len(jpeg) * 0.6)],
        "png_cut": save(rgb, "PNG")[:-40],
        "zero_bytes": b"",
        "html": b"<!doctype html><html><body>404 Not Found</body></html>\n" * 4,
        "eps": save(rgb, "EPS"),
    }


def pillow_decodes(data: bytes) -> bool:
    """Stock Pillow's full decode, under the process's LOAD_TRUNCATED_IMAGES (the loader's setting)."""
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False   # what the loader runs with: nothing sets it
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            img.convert("RGB")
    except Exception:   # noqa: BLE001 - any failure means "not decodable"
        return False
    return True


def reference(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(ImageOps.exif_transpose(img).convert("RGB"))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate")
    files = corpus()
    rows = []
    for name, data in files.items():
        (root / name).write_bytes(data)
        rows.append({"id": name, "image": name, "conversations": [
            {"from": "human", "value": "<image>\nwhat is this?"}, {"from": "gpt", "value": f"a {name}"}]})
    (root / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root, files, shard(root / "d.jsonl", root / "out")


def test_kept_exactly_when_pillow_decodes(sharded):
    root, files, m = sharded
    decodable = {name for name, data in files.items() if pillow_decodes(data)}
    # the corpus has both sides, and the cases the old gate got wrong
    assert {"ppm", "pgm", "pbm", "ico", "jpeg_data_after_eoi", "jpeg_truncated_app14"} <= decodable
    assert {"jpeg_garbage_body", "jpeg_cut_mid_scan", "zero_bytes", "html", "eps"}.isdisjoint(decodable)
    from vlmdata.formats import SampleIndex

    kept = {str(k) for p in sorted((root / "out").glob("*.index.npz")) for k in SampleIndex.load(str(p)).keys()}
    assert kept == decodable
    skipped = m.stats["skipped"]
    assert sum(skipped.values()) == len(files) - len(decodable) and m.num_samples == len(decodable)
    assert skipped == {"empty_file": 1, "not_an_image": 1, "unsupported_format": 1, "truncated_image": 3,
                       "undecodable_image": 1}


@pytest.mark.parametrize("decoder", ["auto", "pillow"])
def test_every_kept_image_decodes_in_the_loader_to_pillows_pixels(sharded, decoder):
    root, files, m = sharded
    ds = VLMDataset(str(root / "out"), max_tokens=2048, max_images=64, image_size=POLICY, rank=0, world_size=1,
                    decoder=decoder, options=DatasetOptions(window_shards=4))
    seen = {}
    for batch in make_loader(ds, num_workers=0):
        assert not batch["stats"].get("skipped"), batch["stats"]
        rows, cu = batch["pixel_values"].numpy(), batch["vision_cu_seqlens"].tolist()
        for i, key in enumerate(batch["sample_keys"]):
            _, gh, gw = batch["image_grid"][i].tolist()
            seen[key] = unflatten_patches(rows[cu[i]:cu[i + 1]], (gh, gw), POLICY.patch, POLICY.merge)
    assert len(seen) == m.num_samples
    for key, pixels in seen.items():
        expect = reference(files[key])
        assert pixels.shape == expect.shape, key
        assert np.array_equal(pixels, expect), (key, np.abs(pixels.astype(int) - expect).max())
