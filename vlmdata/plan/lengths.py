"""Per-sample token lengths from the planning columns, vectorised."""
from __future__ import annotations

import numpy as np

from vlmdata.decode.tiled import sample_args


def image_rows(cols: dict[str, np.ndarray], samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner, row): for every image of `samples`, the position of its sample in `samples` and its image row."""
    n_img = cols["n_images"][samples].astype(np.int64)
    total = int(n_img.sum())
    owner = np.repeat(np.arange(len(samples), dtype=np.int64), n_img)
    first = np.cumsum(n_img) - n_img                      # position of each sample's first image in `row`
    row = cols["image_start"][samples].astype(np.int64)
    rows = np.repeat(row - first, n_img) + np.arange(total, dtype=np.int64)
    return owner, rows


def video_tokens(cols: dict[str, np.ndarray], samples: np.ndarray) -> np.ndarray:
    """Per sample, the tokens of its clips (the `video_tokens` column; 0 in datasets without clips)."""
    if "video_tokens" not in cols:
        return np.zeros(len(samples), np.int64)
    return cols["video_tokens"][samples].astype(np.int64)


def _image_tokens(cols: dict[str, np.ndarray], samples: np.ndarray, owner: np.ndarray, rows: np.ndarray,
                  policy) -> np.ndarray:
    """The policy's tokens of each image (a per_sample policy also told its sample's image count)."""
    extra = sample_args(policy, lambda: cols["n_images"][samples][owner])
    return np.asarray(policy.tokens(cols["width"][rows], cols["height"][rows], *extra))


def sample_lengths(cols: dict[str, np.ndarray], samples: np.ndarray, policy) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, vision tokens) per sample: tokens = text tokens + the policy's tokens for each image + the
    tokens of its clips (vision tokens: the last two, which truncation never cuts into)."""
    owner, rows = image_rows(cols, samples)
    per_image = _image_tokens(cols, samples, owner, rows, policy).astype(np.int64)
    image_tokens = np.bincount(owner, weights=per_image, minlength=len(samples)).astype(np.int64)
    image_tokens += video_tokens(cols, samples)
    return cols["text_tokens"][samples].astype(np.int64) + image_tokens, image_tokens


def image_token_squares(cols: dict[str, np.ndarray], samples: np.ndarray, policy) -> np.ndarray:
    """Per sample, the sum over its images of (the policy's tokens of the image)**2: its vision attention."""
    owner, rows = image_rows(cols, samples)
    per_image = _image_tokens(cols, samples, owner, rows, policy).astype(np.float64)
    vid = video_tokens(cols, samples).astype(np.float64)       # a sample's clips counted as one block
    return (np.bincount(owner, weights=per_image * per_image, minlength=len(samples)) + vid * vid).astype(np.int64)
