#!/usr/bin/env python3
"""vlmdata's own deterministic raw corpus: what VLM training data looks like before sharding.

Tests, benchmarks and the demo make their corpora with this script, so a clone needs nothing beside
it. Everything is a function of `--seed`:

- JPEG images of mixed sizes: 70 % photo-sized (320-640 x 240-640), 20 % high resolution
  (800-1344 per side), 10 % small (64-320), each a colour gradient with shapes and sensor noise;
- 0 images (5 %), 1 image (85 %) or 2-8 images (10 %) per sample;
- texts with a long tail: short captions (~13 words, 60 %), dense captions (~120 words, 30 %) and
  long documents (~900 words, 10 %), words drawn from a fixed vocabulary;
- `--corrupt F` spoils about a fraction F of the samples in one of five ways (a truncated JPEG, a
  zero-byte file, a missing file, non-image bytes behind a .jpg name, a text that is not a string)
  and lists their ids and kinds in OUT/corrupt.json.

    python -m vlmdata.testing.raw_corpus OUT --samples 2000 --seed 0 [--format FORMAT] [--corrupt 0.02]

Formats (all beside OUT/images/*.jpg):
  llava    OUT/data.jsonl: {"id", "images": [...], "conversations": [{"from": "human"}, {"from": "gpt"}]}
           with one "<image>" marker per image (the LLaVA fine-tuning layout; the default)
  caption  OUT/data.jsonl: {"id", "image", "caption"} (one image per sample)
  openai   OUT/data.jsonl: {"id", "messages": [{"role", "content": [{"type": "image_url", ...}, ...]}]}
  csv      OUT/data.csv with columns id,image,caption (one image per sample)
  parquet  OUT/data.parquet with columns id,image,caption (one image per sample; needs pyarrow)

Only numpy and Pillow are needed (pyarrow for parquet). The same command line runs any generator
that takes these arguments; VLMDATA_GEN_RAW names such a script to use instead of this one.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from dataclasses import dataclass

import numpy as np

VOCABULARY = ("a the small large red blue green person dog cat car street table "
              "window tree sky building sign text shows picture left right next to "
              "on under with holding sitting standing two three several bright dark "
              "wooden metal glass food plate cup road field water boat train bus "
              "chart axis value label figure diagram screen menu button page line").split()

FORMATS = ("llava", "caption", "openai", "csv", "parquet")
CORRUPTIONS = ("truncated", "empty", "missing", "not_jpeg", "bad_text")
PROMPT = "Describe the content."
ONE_IMAGE_FORMATS = ("caption", "csv", "parquet")

# (probability, sampler) per regime: where a draw below the cumulative probability lands
SIZE_REGIMES = ((0.70, ((320, 641), (240, 641))), (0.90, ((800, 1345), (800, 1345))), (1.0, ((64, 321), (64, 321))))
TEXT_REGIMES = ((0.60, (2.6, 0.5)), (0.90, (4.8, 0.5)), (1.0, (6.8, 0.6)))


def image_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height) from the size mixture."""
    r = rng.random()
    (w_lo, w_hi), (h_lo, h_hi) = next(bounds for p, bounds in SIZE_REGIMES if r < p)
    return int(rng.integers(w_lo, w_hi)), int(rng.integers(h_lo, h_hi))


def image_count(rng: np.random.Generator) -> int:
    r = rng.random()
    return 0 if r < 0.05 else 1 if r < 0.90 else int(rng.integers(2, 9))


def text(rng: np.random.Generator) -> str:
    """Words from VOCABULARY; how many follows the long-tailed mixture (3 to 5000)."""
    r = rng.random()
    mean, sigma = next(params for p, params in TEXT_REGIMES if r < p)
    n = int(min(max(rng.lognormal(mean, sigma), 3), 5000))
    return " ".join(VOCABULARY[i] for i in rng.integers(0, len(VOCABULARY), n))


def jpeg(rng: np.random.Generator, width: int, height: int) -> bytes:
    """A gradient in random colours, a few filled shapes, then per-pixel noise; JPEG quality 90."""
    from PIL import Image, ImageDraw

    gx = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None]
    gy = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    weights = rng.uniform(-1.0, 1.0, (2, 3)).astype(np.float32)
    base = rng.uniform(30, 200, 3).astype(np.float32) + 80.0 * (gx * weights[0] + gy * weights[1])
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 12))):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        box = [x0, y0, x0 + int(rng.integers(8, max(9, width // 2))), y0 + int(rng.integers(8, max(9, height // 2)))]
        fill = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
    noise = rng.integers(-12, 13, (height, width, 3), dtype=np.int16)
    pixels = np.clip(np.asarray(img, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def spoil(path: str, kind: str) -> None:
    """Make the image file at `path` bad in the way `kind` names."""
    if kind == "missing":
        os.remove(path)
        return
    with open(path, "rb") as f:
        data = f.read()
    spoiled = {"truncated": data[: len(data) // 3], "empty": b"", "not_jpeg": b"<html>not an image</html>" * 20}
    with open(path, "wb") as f:
        f.write(spoiled[kind])


@dataclass
class Sample:
    sid: str
    images: list[str]
    text: object                       # a str, or (for a bad_text corruption) something that is not
    corruption: str | None = None


def draw_samples(out: str, samples: int, seed: int, fmt: str, corrupt: float):
    """Yield each sample after writing (and, when drawn, spoiling) its images under out/images."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(out, "images"), exist_ok=True)
    for i in range(samples):
        sid = f"s{i:07d}"
        rels = []
        for j in range(1 if fmt in ONE_IMAGE_FORMATS else image_count(rng)):
            rel = f"images/{sid}_{j}.jpg"
            with open(os.path.join(out, rel), "wb") as f:
                f.write(jpeg(rng, *image_size(rng)))
            rels.append(rel)
        sample = Sample(sid, rels, text(rng))
        if corrupt and rng.random() < corrupt:
            kind = CORRUPTIONS[int(rng.integers(0, len(CORRUPTIONS)))]
            if kind == "bad_text" or not rels:
                kind, sample.text = "bad_text", {"not": "a string"}
            else:
                spoil(os.path.join(out, rels[0]), kind)
            sample.corruption = kind
        yield sample


def record(sample: Sample, fmt: str) -> dict:
    """The row of one sample in the layout `fmt` names."""
    if fmt in ONE_IMAGE_FORMATS:
        return {"id": sample.sid, "image": sample.images[0], "caption": sample.text}
    if fmt == "openai":
        content = [{"type": "image_url", "image_url": {"url": p}} for p in sample.images]
        content.append({"type": "text", "text": PROMPT})
        return {"id": sample.sid, "messages": [{"role": "user", "content": content},
                                               {"role": "assistant", "content": sample.text}]}
    return {"id": sample.sid, "images": sample.images,
            "conversations": [{"from": "human", "value": "<image>\n" * len(sample.images) + PROMPT},
                              {"from": "gpt", "value": sample.text}]}


def write_rows(rows: list[dict], path: str, fmt: str) -> None:
    """JSON lines, or a csv/parquet table whose cells are strings (a bad text as its JSON)."""
    if fmt not in ("csv", "parquet"):
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        return
    cells = [{k: v if isinstance(v, str) else json.dumps(v) for k, v in r.items()} for r in rows]
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({k: [c[k] for c in cells] for k in ("id", "image", "caption")}), path)
        return
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["id", "image", "caption"])
        writer.writeheader()
        writer.writerows(cells)


def generate_raw(out: str, samples: int = 2000, seed: int = 0, fmt: str = "llava", corrupt: float = 0.0) -> str:
    """Write the corpus under `out`; returns the path of its rows file (data.jsonl/.csv/.parquet)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    os.makedirs(out, exist_ok=True)
    rows_path = os.path.join(out, "data." + (fmt if fmt in ("csv", "parquet") else "jsonl"))
    corrupted, rows = {}, []
    for sample in draw_samples(out, samples, seed, fmt, corrupt):
        if sample.corruption:
            corrupted[sample.sid] = sample.corruption
        rows.append(record(sample, fmt))
    write_rows(rows, rows_path + ".tmp", fmt)
    os.replace(rows_path + ".tmp", rows_path)
    with open(os.path.join(out, "corrupt.json"), "w") as f:
        json.dump(corrupted, f, indent=0, sort_keys=True)
    return rows_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--format", choices=FORMATS, default="llava")
    ap.add_argument("--corrupt", type=float, default=0.0, help="fraction of samples to spoil (0-1)")
    a = ap.parse_args(argv)
    if not 0.0 <= a.corrupt <= 1.0:
        ap.error("--corrupt is a fraction between 0 and 1")
    path = generate_raw(a.out, a.samples, a.seed, a.format, a.corrupt)
    corrupted = len(json.load(open(os.path.join(a.out, "corrupt.json"))))
    print(f"wrote {a.samples} samples to {path} ({corrupted} corrupt)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
