"""A small, learnable image-text corpus in the LLaVA layout, for the demo and the tests.

Used by `vlmdata demo --corpus learnable` and by the training tests, which need a corpus whose loss
must go down (the benchmark corpus is `vlmdata.testing.raw_corpus`). Each sample has 0-3 JPEG images, each a coloured shape on a coloured
background at a random size (so fixed and dynamic resolution both apply),
and a conversation whose answer describes the images with a short fixed
grammar. Answer lengths have a long tail (1 to ~60 sentences), like real
instruction data, so packing matters. Everything is a function of the seed.

    python -m vlmdata_pipelines.corpus OUT --samples 200 --seed 0

writes OUT/images/*.jpg and OUT/data.jsonl with lines
{"id", "images": [...], "conversations": [{"from": "human", ...}, {"from": "gpt", ...}]}.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys

import numpy as np

COLORS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220), "yellow": (230, 210, 40),
          "white": (245, 245, 245), "black": (15, 15, 15), "purple": (140, 50, 170), "orange": (240, 140, 30)}
SHAPES = ("circle", "square")
PLACES = ("top left", "top right", "bottom left", "bottom right", "center")


def _draw(rng: np.random.Generator, shape: str, color: str, background: str, place: str) -> tuple[bytes, int, int]:
    from PIL import Image, ImageDraw

    w, h = int(rng.integers(48, 321)), int(rng.integers(48, 321))
    img = Image.new("RGB", (w, h), COLORS[background])
    draw = ImageDraw.Draw(img)
    side = max(8, min(w, h) // 2)
    cx = {"left": w // 4, "right": 3 * w // 4}.get(place.split()[-1], w // 2)
    cy = {"top": h // 4, "bottom": 3 * h // 4}.get(place.split()[0], h // 2)
    box = [cx - side // 2, cy - side // 2, cx + side // 2, cy + side // 2]
    (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=COLORS[color])
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue(), w, h


def _sentences(rng: np.random.Generator, facts: list[dict]) -> list[str]:
    if not facts:
        count = int(np.clip(rng.lognormal(1.0, 0.8), 1, 60))
        return ["there is no image here." for _ in range(count)]
    out = []
    for i, f in enumerate(facts):
        out.append(f"image {i + 1} shows a {f['color']} {f['shape']} on a {f['background']} background.")
    extra = int(np.clip(rng.lognormal(1.2, 1.1), 0, 60))
    for j in range(extra):
        f = facts[j % len(facts)]
        out.append(f"the {f['color']} {f['shape']} is at the {f['place']}.")
    return out


def generate(out: str, samples: int, seed: int = 0) -> str:
    """Write the corpus under `out`; returns the path of data.jsonl."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(out, "images"), exist_ok=True)
    names = list(COLORS)
    path = os.path.join(out, "data.jsonl")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for i in range(samples):
            sid = f"c{i:07d}"
            k = int(rng.choice([0, 1, 1, 1, 1, 1, 1, 2, 2, 3]))
            facts, rels = [], []
            for j in range(k):
                color, background = rng.choice(names, size=2, replace=False)
                fact = {"shape": str(rng.choice(SHAPES)), "color": str(color), "background": str(background),
                        "place": str(rng.choice(PLACES))}
                data, _, _ = _draw(rng, fact["shape"], fact["color"], fact["background"], fact["place"])
                rel = f"images/{sid}_{j}.jpg"
                with open(os.path.join(out, rel), "wb") as im:
                    im.write(data)
                facts.append(fact)
                rels.append(rel)
            prompt = "<image>\n" * k + "Describe the images."
            answer = " ".join(_sentences(rng, facts))
            rec = {"id": sid, "images": rels,
                   "conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": answer}]}
            f.write(json.dumps(rec) + "\n")
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    path = generate(a.out, a.samples, a.seed)
    print(f"wrote {a.samples} samples to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
