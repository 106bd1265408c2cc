"""The Gemma 3 test corpus: the hostile reference conversations plus conversations with whitespace next to
every image (what the processor's "\\n\\n" pieces around `<start_of_image>`/`<end_of_image>` merge with),
and image sizes from 3x2 to 5000x40."""
from __future__ import annotations

from tests.helpers.models import reference_conversations, shard_reference_rows

__all__ = ["CORPUS", "SIZES", "WHITESPACE_CONVERSATIONS", "shard_corpus"]

SIZES = [(640, 480), (3, 2), (5000, 40), (40, 3000), (896, 896), (333, 777), (2400, 1800), (97, 211), (28, 28)]


def _t(s: str) -> dict:
    return {"type": "text", "text": s}


IMG = {"type": "image"}

# Whitespace next to every image: text items ending / starting with newlines and spaces (the template trims
# them), a system prompt ending in newlines before an image (its "\n\n" is not trimmed), images side by side,
# an image alone in a turn, string contents, non-ASCII beside an image.
WHITESPACE_CONVERSATIONS = [
    ([{"role": "user", "content": [_t("Look:\n\n"), IMG, _t("\n\n  and tell me.")]},
      {"role": "assistant", "content": [_t("A red box.")]}], 1),
    ([{"role": "system", "content": [_t("Be brief.  \n")]},
      {"role": "user", "content": [IMG, IMG, _t(" two? ")]},
      {"role": "assistant", "content": [_t("\n Yes, two. \n")]}], 2),
    ([{"role": "system", "content": "Sys as a string\n\n"},
      {"role": "user", "content": [_t("end with spaces   "), IMG]},
      {"role": "assistant", "content": "plain string reply"},
      {"role": "user", "content": [IMG]},
      {"role": "assistant", "content": [_t("the quick brown fox\n\n")]}], 2),
    ([{"role": "user", "content": [_t("東京\n"), IMG, _t("\nПривет ☕ naïve café")]},
      {"role": "assistant", "content": [_t("はい 😀\n\n\n")]}], 1),
    ([{"role": "user", "content": "No image, just text.\n\n"},
      {"role": "assistant", "content": [_t("  model\nuser  ")]}], 0),
]
CORPUS = WHITESPACE_CONVERSATIONS + reference_conversations()


def shard_corpus(folder, out, conversations=None, sizes=None, max_samples_per_shard: int = 5):
    """The corpus (or `conversations`) as rows with PNG images of `sizes`, sharded with the model folder;
    returns (rows file, [(messages, PIL images)] per row "conv{n}", dataset folder)."""
    return shard_reference_rows(out, folder, conversations or CORPUS, sizes or SIZES,
                                max_samples_per_shard=max_samples_per_shard)
