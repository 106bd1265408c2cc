"""The raw corpus of tests and benchmarks: its generator (`raw_corpus.py`) and a model of its statistics.

`gen_raw_lengths` and `image_and_word_counts` draw per-sample image counts
and caption lengths from the same distributions as the generator (without making
any image), so packing and planning can be measured on millions of samples.
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np

from vlmdata.testing.raw_corpus import SIZE_REGIMES
from vlmdata.testing.raw_corpus import VOCABULARY as GEN_RAW_WORDS

# BOS USER ("<image>\n" * k + "Describe the content.") ASSISTANT <caption> EOS, in byte tokens, without
# the caption and the k "\n" after each placeholder: the fixed part of every sample
PROMPT_TOKENS = 25


def generator_script() -> str:
    """The corpus generator to run: $VLMDATA_GEN_RAW when it names a file (any script taking
    `OUT --samples N --seed S --format F --corrupt X`), else vlmdata's own `raw_corpus.py`."""
    override = os.environ.get("VLMDATA_GEN_RAW", "")
    if override:
        if not Path(override).is_file():
            raise FileNotFoundError(f"VLMDATA_GEN_RAW={override} is not a file")
        return str(Path(override).resolve())
    return str(Path(__file__).with_name("raw_corpus.py"))


def image_and_word_counts(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Images per sample (0, 1, or 2-8) and caption words per sample, as raw_corpus.py draws them."""
    r = rng.random(n)
    images = np.where(r < 0.05, 0, np.where(r < 0.9, 1, rng.integers(2, 9, n)))
    r2 = rng.random(n)
    words = np.where(r2 < 0.6, rng.lognormal(2.6, 0.5, n),
                     np.where(r2 < 0.9, rng.lognormal(4.8, 0.5, n), rng.lognormal(6.8, 0.6, n)))
    return images.astype(np.int64), np.clip(words.astype(np.int64), 3, 5000)


def image_sizes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(width, height) of n images from raw_corpus.py's size mixture."""
    r = rng.random(n)
    regime = np.searchsorted([p for p, _ in SIZE_REGIMES], r, side="right")
    out = []
    for axis in (0, 1):
        lo = np.asarray([b[axis][0] for _, b in SIZE_REGIMES])[regime]
        hi = np.asarray([b[axis][1] for _, b in SIZE_REGIMES])[regime]
        out.append((lo + np.floor(rng.random(n) * (hi - lo))).astype(np.int64))
    return out[0], out[1]


def gen_raw_lengths(n: int, seed: int = 0, image_tokens: int = 576) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, images) per sample: LLaVA layout, byte tokenizer, `image_tokens` per image."""
    rng = np.random.default_rng(seed)
    images, words = image_and_word_counts(rng, n)
    word_len = np.asarray([len(w) for w in GEN_RAW_WORDS])
    owner = np.repeat(np.arange(n), words)
    chars = np.bincount(owner, weights=word_len[rng.integers(0, len(word_len), int(words.sum()))], minlength=n)
    text = PROMPT_TOKENS + images + chars.astype(np.int64) + words - 1
    return text + image_tokens * images, images


def corpus_images(root: str | Path, limit: int | None = None) -> tuple[list[bytes], list[tuple[int, int]]]:
    """Encoded images of a generated corpus in sample order, with (width, height) from the header; the
    missing, empty and unreadable files of its corruptions are left out."""
    from PIL import Image

    root, data, sizes = Path(root), [], []
    for line in (root / "data.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for rel in rec.get("images") or ([rec["image"]] if "image" in rec else []):
            p = root / rel
            if not p.exists() or p.stat().st_size == 0:
                continue
            raw = p.read_bytes()
            try:
                with Image.open(io.BytesIO(raw)) as im:
                    sizes.append(im.size)
            except OSError:
                continue
            data.append(raw)
            if limit is not None and len(data) >= limit:
                return data, sizes
    return data, sizes
