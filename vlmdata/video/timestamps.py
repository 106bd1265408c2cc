"""Qwen3-VL's text timestamps: `<{t:.1f} seconds>` before each temporal patch of a video.

t is the processor's `_calculate_timestamps`: the sampled frame indices, padded with the last one to a
multiple of the temporal patch, divided by the clip's fps; each patch takes the mean of its first and
last frame's time.

The text is tokenized once per tokenizer, piece by piece ("<", each digit, ".", " seconds>"), and a
timestamp's ids are the concatenation of its pieces' ids. That holds for tokenizers whose pre-tokenizer
splits digits one by one and punctuation from them (Qwen2's regex does); `stamp_pieces` checks it
against the tokenizer itself on a set of timestamps and returns None when it does not hold.
"""
from __future__ import annotations

import numpy as np

__all__ = ["TIMESTAMP_PIECES", "patch_timestamps", "stamp_ids", "stamp_pieces", "stamp_text", "stamps_length"]

TIMESTAMP_PIECES = ("<", *"0123456789", ".", " seconds>")
CHECKED = (0.0, 0.5, 1.25, 7.0, 9.95, 10.0, 12.3, 59.9, 99.95, 123.4, 1000.0, 4567.8, 10799.9)


def stamp_text(seconds: float) -> str:
    """The processor's text for one temporal patch's time."""
    return f"<{seconds:.1f} seconds>"


def stamp_ids(seconds: float, pieces: dict[str, tuple[int, ...]]) -> list[int]:
    """Token ids of `stamp_text(seconds)`, composed from the pieces' ids."""
    text = stamp_text(seconds)
    body = text[1:-len(" seconds>")]
    out = list(pieces["<"])
    for ch in body:
        out += pieces[ch]
    return out + list(pieces[" seconds>"])


def stamp_pieces(encode) -> dict[str, tuple[int, ...]] | None:
    """Each piece's ids from `encode(text) -> list[int]` (no special tokens added), or None when composed
    ids differ from the tokenizer's own for one of the checked timestamps."""
    pieces = {p: tuple(int(i) for i in encode(p)) for p in TIMESTAMP_PIECES}
    for t in CHECKED:
        if stamp_ids(t, pieces) != [int(i) for i in encode(stamp_text(t))]:
            return None
    return pieces


def stamps_length(seconds: np.ndarray, pieces: dict[str, tuple[int, ...]]) -> int:
    """Total ids of the timestamps `seconds` (what `stamp_ids` gives them, counted without building them)."""
    body = "".join(f"{t:.1f}" for t in seconds.tolist()).encode("ascii")
    per_char = np.zeros(128, np.int64)
    for ch in "0123456789.":
        per_char[ord(ch)] = len(pieces[ch])
    fixed = len(pieces["<"]) + len(pieces[" seconds>"])
    return int(per_char[np.frombuffer(body, np.uint8)].sum()) + fixed * len(seconds)


def patch_timestamps(indices: np.ndarray, fps: float, temporal_patch: int) -> np.ndarray:
    """float64 seconds per temporal patch, as the processor computes them (see the module docstring; the same
    IEEE double operations as its Python floats)."""
    idx = np.asarray(indices, np.int64)
    if len(idx) % temporal_patch:
        idx = np.concatenate([idx, np.full(temporal_patch - len(idx) % temporal_patch, idx[-1])])
    times = (idx / float(fps)).reshape(-1, temporal_patch)
    return (times[:, 0] + times[:, -1]) / 2
