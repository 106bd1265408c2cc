"""The benchmark corpus of `../shared/bench/gen_raw.py`: where its generator is, and a model of its statistics.

`gen_raw_lengths` and `image_and_word_counts` draw per-sample image counts
and caption lengths from the same distributions as gen_raw.py (without making
any image), so packing and planning can be measured on millions of samples.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

# gen_raw.py's vocabulary (captions are words drawn uniformly from it, joined by spaces)
GEN_RAW_WORDS = ("a the small large red blue green person dog cat car street table "
                 "window tree sky building sign text shows picture left right next to "
                 "on under with holding sitting standing two three several bright dark "
                 "wooden metal glass food plate cup road field water boat train bus "
                 "chart axis value label figure diagram screen menu button page line").split()

# BOS USER ("<image>\n" * k + "Describe the content.") ASSISTANT <caption> EOS, in byte tokens, without
# the caption and the k "\n" after each placeholder: the fixed part of every sample
PROMPT_TOKENS = 25


def find_gen_raw(repo: str | Path | None = None) -> str | None:
    """gen_raw.py: $VLMDATA_GEN_RAW, else shared/bench/gen_raw.py beside the checkout `repo`
    (default: the one this package lives in); None if absent."""
    repo = Path(repo) if repo is not None else Path(__file__).resolve().parents[2]
    for path in (os.environ.get("VLMDATA_GEN_RAW", ""), repo.parent / "shared" / "bench" / "gen_raw.py"):
        if path and Path(path).is_file():
            return str(Path(path).resolve())
    return None


def require_gen_raw() -> str:
    """Like find_gen_raw, but a clear error when it is missing."""
    path = find_gen_raw()
    if path is None:
        raise FileNotFoundError("gen_raw.py not found: put the shared/ folder beside this checkout "
                                "or set VLMDATA_GEN_RAW to the generator's path")
    return path


def image_and_word_counts(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Images per sample (0, 1, or 2-8) and caption words per sample, as gen_raw.py draws them."""
    r = rng.random(n)
    images = np.where(r < 0.05, 0, np.where(r < 0.9, 1, rng.integers(2, 9, n)))
    r2 = rng.random(n)
    words = np.where(r2 < 0.6, rng.lognormal(2.6, 0.5, n),
                     np.where(r2 < 0.9, rng.lognormal(4.8, 0.5, n), rng.lognormal(6.8, 0.6, n)))
    return images.astype(np.int64), np.clip(words.astype(np.int64), 3, 5000)


def gen_raw_lengths(n: int, seed: int = 0, image_tokens: int = 576) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, images) per sample: LLaVA layout, byte tokenizer, `image_tokens` per image."""
    rng = np.random.default_rng(seed)
    images, words = image_and_word_counts(rng, n)
    word_len = np.asarray([len(w) for w in GEN_RAW_WORDS])
    owner = np.repeat(np.arange(n), words)
    chars = np.bincount(owner, weights=word_len[rng.integers(0, len(word_len), int(words.sum()))], minlength=n)
    text = PROMPT_TOKENS + images + chars.astype(np.int64) + words - 1
    return text + image_tokens * images, images
