"""The `processor` image policy: an image's tokens and pixels by the model's own Hugging Face processor.

For model families vlmdata has no native module for (the generic family, `text.families.generic`).
The policy names the model folder and its processor files' sha256 (`hf_folder`); where it runs (the
planner, the DataLoader workers) it loads that processor with transformers and asks it:

- `tokens(w, h)` — the planner's count, vectorised: cached per distinct size; a size not seen yet is
  counted by `count_rule`, which the family chose when it loaded (and checked on probe sizes):
  "nmt" = the processor's `_get_num_multimodal_tokens(image_sizes=...)` plus `count_offset`;
  "key" = the expansion's length for that method's (tokens, patches) answer, measured once per answer;
  "run" = the expansion's length, the processor run on a blank image of that size.
- `expansion(w, h)` — the ids replacing the placeholder: the processor run on its own image token with an
  image of that size (its expansion depends on the size alone: the family checks that when it loads);
  an expansion whose length is not the planned count is a ConfigError, never a silent misalignment.
- `pixels(image, resample)` — a dict: what the processor returns for that one RGB image (its
  pixel_values and the keys beside it, e.g. image_sizes), as numpy arrays, by its image step alone; it
  also records the expansion of that image's size (the image step's replacement text, tokenized once per
  distinct text, where the processor's `__call__` is transformers' own; else the whole processor run). `pixel_fields` / `fill_pixel_fields` put a pack's images into the
  pack as the processor returns them for all of them at once: per key, concatenated along the first
  axis, zero-padded to the largest of the other axes (checked against the processor when the family loads).
  `pixel_values` keeps its name; the other keys become `processor_<key>` (`PROCESSOR_PREFIX`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from vlmdata.decode.tiled import TiledPolicy
from vlmdata.decode.tiling.processor_scale import STOP_BEFORE_SCALE, apply_table, table_for
from vlmdata.errors import ConfigError

__all__ = ["COUNT_RULES", "POLICY", "PROBE_SIZES", "PROCESSOR_PREFIX", "TEXT_KEYS", "ProcessorPolicy", "combined", "field_name",
           "write_combined"]

COUNT_RULES = ("nmt", "key", "run")
PROBE_SIZES = ((640, 480), (100, 30), (57, 223), (333, 1000), (28, 28))   # checked by the generic family
PROCESSOR_PREFIX = "processor_"
TEXT_KEYS = ("input_ids", "attention_mask")     # what the tokenizer adds to a processor's output
_CACHES = ("_expansions", "_counts", "_key_lengths", "_image_kwargs", "_replacements")


def _replaces_by_text(proc) -> bool:
    """True when the processor's `__call__` is transformers' own: its ids are its text with each image token
    replaced by the text its image step gives, tokenized."""
    from transformers import ProcessorMixin

    return type(proc).__call__ is ProcessorMixin.__call__


def _converts_as_pil_backend(proc) -> bool:
    """True when the image processor's RGB conversion is transformers' PIL backend's (no override)."""
    from transformers.image_processing_backends import PilBackend

    ip = proc.image_processor
    return isinstance(ip, PilBackend) and type(ip).convert_to_rgb is PilBackend.convert_to_rgb


def field_name(key: str) -> str:
    """The pack field holding the processor's output `key`."""
    return key if key == "pixel_values" else PROCESSOR_PREFIX + key


def combined(per_image: list[dict]) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """key -> (dtype, shape) of the processor's outputs for several images together (see the module docstring)."""
    if not per_image:
        return {}
    out = {}
    for key, first in per_image[0].items():
        arrays = [im[key] for im in per_image]
        rest = tuple(np.max([a.shape[1:] for a in arrays], axis=0).tolist()) if first.ndim > 1 else ()
        out[key] = (first.dtype, (sum(len(a) for a in arrays), *rest))
    return out


def write_combined(per_image: list[dict], arrays: dict[str, np.ndarray]) -> None:
    """Write each image's outputs into `arrays` (key -> array of `combined`'s shape), zero padding."""
    if not per_image:
        return
    for key in per_image[0]:
        dst, at = arrays[key], 0
        if any(im[key].shape[1:] != dst.shape[1:] for im in per_image):
            dst[...] = 0
        for im in per_image:
            a = im[key]
            dst[(slice(at, at + len(a)), *(slice(0, s) for s in a.shape[1:]))] = a
            at += len(a)


@dataclass(frozen=True)
class ProcessorPolicy(TiledPolicy):
    """The processor's rules for one model folder (see the module docstring)."""

    kind = "processor"
    folder: str = ""
    files: tuple = ()                # ((name, sha256), ...) of the folder's processor files
    count_rule: str = "run"
    count_offset: int = 0

    def __post_init__(self) -> None:
        if self.count_rule not in COUNT_RULES:
            raise ValueError(f"count_rule must be one of {', '.join(COUNT_RULES)}, got {self.count_rule!r}")

    # ---- the processor ---------------------------------------------------------------------------
    def processor(self):
        """The folder's processor (loaded once per process; ConfigError when the folder is missing or changed)."""
        proc = self.__dict__.get("_processor")
        if proc is None:
            from vlmdata.decode.tiling.hf_folder import load_processor

            proc = load_processor(self.folder, self.files)
            self.__dict__["_processor"] = proc
        return proc

    def run(self, image: Image.Image) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(expansion ids, {key: array}) the processor gives its image token with `image`."""
        proc = self.processor()
        out = proc(text=[proc.image_token], images=[image], add_special_tokens=False, return_tensors="np")
        ids = np.asarray(out["input_ids"][0], np.int64)
        return ids, {k: np.asarray(v) for k, v in out.items() if k not in TEXT_KEYS}

    # ---- tokens ----------------------------------------------------------------------------------
    def tokens(self, width, height) -> np.ndarray:
        w, h = np.broadcast_arrays(np.asarray(width, np.int64), np.asarray(height, np.int64))
        codes = (w.reshape(-1) << 32) | h.reshape(-1)
        uniq, inverse = np.unique(codes, return_inverse=True)
        counts = self.__dict__.setdefault("_counts", {})
        missing = [c for c in uniq.tolist() if c not in counts]
        if missing:
            counts.update(zip(missing, self._count([(c >> 32, c & 0xFFFFFFFF) for c in missing])))
        values = np.fromiter((counts[c] for c in uniq.tolist()), np.int64, len(uniq))
        return values[inverse].reshape(w.shape)

    def _count(self, sizes: list[tuple[int, int]]) -> list[int]:
        if self.count_rule == "run":
            return [len(self.expansion(w, h)) for w, h in sizes]
        data = self.processor()._get_num_multimodal_tokens(image_sizes=[(h, w) for w, h in sizes])
        if self.count_rule == "nmt":
            return [int(n) + self.count_offset for n in data.num_image_tokens]
        lengths = self.__dict__.setdefault("_key_lengths", {})
        out = []
        for (w, h), key in zip(sizes, zip(data.num_image_tokens, data.num_image_patches)):
            if key not in lengths:
                lengths[key] = len(self.build_expansion((w, h)))
            out.append(lengths[key])
        return out

    def tiles(self, width, height) -> np.ndarray:
        return np.ones(np.broadcast(np.asarray(width), np.asarray(height)).shape, np.int64)

    # ---- expansion -------------------------------------------------------------------------------
    def layout_key(self, width: int, height: int):
        return int(width), int(height)

    def build_expansion(self, key) -> np.ndarray:
        return self.run(Image.new("RGB", key))[0]

    def expansion(self, width: int, height: int) -> np.ndarray:
        cache = self.__dict__.setdefault("_expansions", {})
        key = self.layout_key(width, height)
        ids = cache.get(key)
        if ids is None:
            ids = self._checked(key, np.asarray(self.build_expansion(key), np.int64))
        return ids

    def _checked(self, key, ids: np.ndarray) -> np.ndarray:
        """`ids` cached as `key`'s expansion after checking it has the planned length."""
        ids.setflags(write=False)
        self.__dict__.setdefault("_expansions", {})[key] = ids
        if self.count_rule != "run" and int(self.tokens([key[0]], [key[1]])[0]) != len(ids):
            raise ConfigError(f"the processor of {self.folder} expands a {key[0]}x{key[1]} image into {len(ids)} "
                              f"ids but its count ({self.count_rule} rule) says {int(self.tokens([key[0]], [key[1]])[0])}"
                              ": the generic family cannot plan this model's images")
        return ids

    # ---- pixels ----------------------------------------------------------------------------------
    def pixels(self, image, resample: int) -> dict[str, np.ndarray]:
        """The processor's outputs for one RGB image (its own resample filter: `resample` is not used), by its
        image step alone. The first time a size is seen, that size's expansion is recorded too: the tokens of
        the replacement text the image step gives (tokenized once per distinct text) where the processor's
        `__call__` is transformers' own (it tokenizes that text), else the whole processor's run. The image
        processor's rescale and normalisation are one lookup table where `processor_scale` has checked that
        this gives its pixel_values bit for bit; its conversion to RGB is skipped for an RGB image."""
        key = self.layout_key(image.width, image.height)
        proc = self.processor()
        if key not in self.__dict__.get("_expansions", {}) and not _replaces_by_text(proc):
            ids, out = self.run(image)
            self._checked(key, ids)
            return out
        table = table_for(self)
        kwargs = {**self.image_kwargs(), **(STOP_BEFORE_SCALE if table is not None else {})}
        if image.mode == "RGB" and image.info.get("transparency") is None and _converts_as_pil_backend(proc):
            kwargs["do_convert_rgb"] = False          # already RGB: its conversion would copy the same pixels
        processed, replacements = proc._process_images([image], **kwargs)
        if key not in self.__dict__.get("_expansions", {}):
            self._checked(key, self._replacement_ids(proc, replacements[0]))
        out = {k: np.asarray(v) for k, v in processed.items() if k not in proc.unused_input_names}
        if table is not None:
            out["pixel_values"] = apply_table(out["pixel_values"], table)
        return out

    def image_kwargs(self) -> dict:
        """The images_kwargs the processor passes its image processor (its own defaults, numpy arrays)."""
        kwargs = self.__dict__.get("_image_kwargs")
        if kwargs is None:
            proc = self.processor()
            kwargs = proc._merge_kwargs(tokenizer_init_kwargs=proc.tokenizer.init_kwargs,
                                        return_tensors="np")["images_kwargs"]
            self.__dict__["_image_kwargs"] = kwargs
        return kwargs

    def _replacement_ids(self, proc, text: str) -> np.ndarray:
        """The ids the processor gives its image token replaced by `text` (cached per distinct text)."""
        cache = self.__dict__.setdefault("_replacements", {})
        ids = cache.get(text)
        if ids is None:
            kwargs = proc._merge_kwargs(tokenizer_init_kwargs=proc.tokenizer.init_kwargs, add_special_tokens=False,
                                        return_tensors="np")["text_kwargs"]
            ids = cache[text] = np.asarray(proc.tokenizer([text], **kwargs)["input_ids"][0], np.int64)
        return ids

    def pixel_fields(self, images: list[dict]) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """Pack field -> (dtype, shape) of a pack's images (see the module docstring)."""
        return {field_name(k): v for k, v in combined(images).items()}

    def fill_pixel_fields(self, images: list[dict], arrays: dict) -> None:
        write_combined(images, {k: arrays[field_name(k)] for k in (images[0] if images else ())})

    def pack_fields(self, images: list[dict]) -> dict[str, np.ndarray]:
        """Pack field -> array of a pack's images (`pixels` outputs), as the collate step lays them out."""
        arrays = {k: np.empty(shape, dtype) for k, (dtype, shape) in self.pixel_fields(images).items()}
        self.fill_pixel_fields(images, arrays)
        return arrays

    def probe_image(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(expansion ids, pack fields) of a black image of the smallest probe size (for a model's dry run)."""
        w, h = min(PROBE_SIZES, key=lambda size: size[0] * size[1])
        fields = self.pack_fields([self.pixels(Image.new("RGB", (w, h)), 3)])
        return self.expansion(w, h), fields

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in _CACHES and k != "_processor"}


POLICY = ProcessorPolicy
