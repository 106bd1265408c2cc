"""What the generic family checks when it loads, on probe images and texts, before it shards anything.

The generic family trusts a model's processor only as far as these checks go; each failure is a
ConfigError saying which claim failed:

- `probe_expansions`: the expansion of the image token depends on the image's size alone (a blank image
  and a noise image of the same size give the same ids and output shapes), so the loader can expand from
  stored sizes;
- `choose_count_rule`: how the planner counts without running the processor (`decode.tiling.processor`);
- `check_batching`: the processor's outputs for several images at once are its per-image outputs
  concatenated and zero-padded (what the pack holds), and their expansions concatenated; its image step
  alone gives the whole processor's outputs, and the expansions the loader records from it (the
  replacement text, tokenized) are the whole processor's;
- `check_tokenization`: the processor's full tokenization of probe conversations (text touching the image
  marker on either side, several images, an image first) equals vlmdata's ids with each placeholder
  expanded: text the processor adds around the marker must not change how its neighbours tokenize; and
  the processor returns no text keys beside input_ids / attention_mask (token_type_ids: not built here).
"""
from __future__ import annotations

import numpy as np
from PIL import Image

from vlmdata.decode.tiling.processor import PROBE_SIZES, TEXT_KEYS, ProcessorPolicy, combined, write_combined
from vlmdata.errors import ConfigError
from vlmdata.text.conversation import Conversation

__all__ = ["PROBE_SIZES", "check_batching", "check_tokenization", "choose_count_rule", "expand_placeholders",
           "probe_expansions"]



def _noise(size: tuple[int, int], seed: int) -> Image.Image:
    w, h = size
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def probe_expansions(policy: ProcessorPolicy) -> dict[tuple[int, int], np.ndarray]:
    """size -> expansion ids of the probe sizes; ConfigError when an expansion depends on the pixels."""
    out = {}
    for i, size in enumerate(PROBE_SIZES):
        ids, blank = policy.run(Image.new("RGB", size))
        ids2, noise = policy.run(_noise(size, i))
        shapes = {k: v.shape for k, v in blank.items()}
        if not np.array_equal(ids, ids2) or shapes != {k: v.shape for k, v in noise.items()}:
            raise ConfigError(f"{policy.folder}: the processor expands a {size[0]}x{size[1]} image differently "
                              "depending on its pixels, not only its size; the generic family expands from stored "
                              "sizes and cannot serve it")
        out[size] = ids
    return out


def choose_count_rule(policy: ProcessorPolicy, expansions: dict) -> tuple[str, int]:
    """(count_rule, count_offset) for the planner, checked on the probe expansions."""
    proc = policy.processor()
    if not hasattr(proc, "_get_num_multimodal_tokens"):
        return "run", 0
    sizes = list(expansions)
    try:
        data = proc._get_num_multimodal_tokens(image_sizes=[(h, w) for w, h in sizes])
        counts = [int(n) for n in data.num_image_tokens]
    except Exception:  # noqa: BLE001 - a processor whose counting method fails is counted by running it
        return "run", 0
    offsets = {len(expansions[s]) - n for s, n in zip(sizes, counts)}
    if len(offsets) == 1:
        return "nmt", offsets.pop()
    patches = data.num_image_patches or [None] * len(sizes)
    by_key: dict = {}
    for s, key in zip(sizes, zip(counts, patches)):
        by_key.setdefault(key, set()).add(len(expansions[s]))
    return ("key", 0) if all(len(v) == 1 for v in by_key.values()) else ("run", 0)


def check_batching(policy: ProcessorPolicy, expansions: dict) -> None:
    """ConfigError unless the processor's outputs for images together are the combined per-image ones."""
    proc = policy.processor()
    sizes = PROBE_SIZES[:3]
    images = [_noise(s, 10 + i) for i, s in enumerate(sizes)]
    out = proc(text=[proc.image_token * len(images)], images=images, add_special_tokens=False, return_tensors="np")
    singles = [policy.run(im)[1] for im in images]
    for im, single in zip(images, singles):
        for _ in range(2):                                     # a size not seen yet, then one seen
            alone = policy.pixels(im, 3)
            if alone.keys() != single.keys() or not all(np.array_equal(alone[k], single[k]) for k in single):
                raise ConfigError(f"{policy.folder}: the processor's image step alone does not give what the "
                                  "whole processor gives for the same image; the generic family cannot serve it")
    for size, ids in expansions.items():
        policy.pixels(Image.new("RGB", size), 3)               # records the size's expansion as the loader does
        if not np.array_equal(policy.expansion(*size), ids):
            raise ConfigError(f"{policy.folder}: the processor's ids for a {size[0]}x{size[1]} image are not the "
                              "replacement text of its image step, tokenized; the generic family cannot serve it")
    layout = combined(singles)
    arrays = {k: np.empty(shape, dtype) for k, (dtype, shape) in layout.items()}
    write_combined(singles, arrays)
    together = {k: np.asarray(v) for k, v in out.items() if k not in TEXT_KEYS}
    same = together.keys() == arrays.keys() and all(
        together[k].shape == arrays[k].shape and np.array_equal(together[k], arrays[k]) for k in arrays)
    if not same:
        raise ConfigError(f"{policy.folder}: the processor's outputs for several images at once are not its "
                          "per-image outputs concatenated (and zero-padded); the generic family packs images that "
                          "way and cannot serve this processor")
    if not np.array_equal(out["input_ids"][0], np.concatenate([expansions[s] for s in sizes])):
        raise ConfigError(f"{policy.folder}: the processor expands an image differently next to another image")


def expand_placeholders(ids: np.ndarray, image_id: int, expansions: list[np.ndarray]) -> np.ndarray:
    """`ids` with its image placeholders replaced, in order, by `expansions`."""
    at = np.flatnonzero(ids == image_id)
    pieces, last = [], 0
    for pos, exp in zip(at.tolist(), expansions):
        pieces += [ids[last:pos], exp]
        last = pos + 1
    pieces.append(ids[last:])
    return np.concatenate(pieces).astype(np.int64)


def _probe_conversations() -> list[Conversation]:
    t = lambda s: {"type": "text", "text": s}  # noqa: E731
    img = {"type": "image"}
    return [
        Conversation([{"role": "user", "content": [t("Look:"), img, t("what is this?")]},
                      {"role": "assistant", "content": [t("A cat.")]}], 1),
        Conversation([{"role": "user", "content": [img, img, t(" Compare them, naïve café.")]},
                      {"role": "assistant", "content": [t("The first is wider.")]}], 2),
        Conversation([{"role": "user", "content": [t("x "), img, t("\ny")]},
                      {"role": "assistant", "content": [t("ok")]}], 1),
    ]


def check_tokenization(family) -> None:
    """ConfigError unless the processor tokenizes the probe conversations as vlmdata does (module docstring)."""
    policy, proc = family.vision.image_policy(), family.processor
    sizes = iter(PROBE_SIZES * 2)
    for conv in _probe_conversations():
        text, _ = family.render(conv)
        shown = [next(sizes) for _ in range(conv.n_images)]
        ref = proc(text=[text], images=[Image.new("RGB", s) for s in shown], return_tensors="np")
        extra = sorted(set(ref) - set(TEXT_KEYS) - set(policy.run(Image.new("RGB", shown[0]))[1]))
        if extra:
            raise ConfigError(f"{family.folder.path}: the processor also returns {', '.join(extra)}, which the "
                              "generic family does not build; this model needs a native family")
        ours = expand_placeholders(family.encode(conv)[0].astype(np.int64), family.image_token_id,
                                   [policy.expansion(*s) for s in shown])
        want = np.asarray(ref["input_ids"][0], np.int64)
        if not np.array_equal(ours, want):
            n = min(len(ours), len(want))
            i = int(np.flatnonzero(ours[:n] != want[:n])[0]) if (ours[:n] != want[:n]).any() else n
            tok = proc.tokenizer
            raise ConfigError(
                f"{family.folder.path}: the processor's text around an image tokenizes differently from vlmdata's "
                f"(at token {i}: processor {tok.convert_ids_to_tokens(want[max(0, i - 2):i + 3].tolist())}, "
                f"vlmdata {tok.convert_ids_to_tokens(ours[max(0, i - 2):i + 3].tolist())}, in {text!r}); what "
                "the processor puts around its image marker joins the neighbouring text, so the generic family "
                "cannot shard this model exactly: it needs a native family")
