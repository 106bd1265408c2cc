"""Tiled image policies: an image becomes square tiles and a structured run of tokens.

InternVL, Idefics3/SmolVLM, LLaVA-OneVision and Gemma 3 do not give an image one block of identical
image tokens: their processors cut it into tiles (crops of a resized image, plus a global view) and
replace the image placeholder with a token sequence that depends on the tiling (`<img>` +
`<IMG_CONTEXT>` x 256 per tile + `</img>`; `<row_1_col_2>` markers; newline tokens). A
`TiledPolicy` subclass states one family's rules, from the image's stored width and height alone
(no decode), so the planner counts exactly what the loader builds:

- `tokens(width, height)` — vectorised: how many ids replace one placeholder (the planner's count);
- `expansion(width, height)` — those ids (cached per tiling); the placeholder is the sequence's
  `image_token_id` position of the text the family encoded at shard time;
- `tiles(width, height)` — vectorised: how many tiles the image gives (rows of `pixel_values`);
- `pixels(image, resample)` — the tiles of one decoded image, (n, tile, tile, 3) uint8, made as the
  family's image processor makes them from the same RGB image (`decode.exact.processor_rgb`).

A `per_sample` policy lays an image out by how many images its sample holds too (LLaVA-OneVision:
anyres for a lone image, one tile for each of several): its `tokens`, `tiles`, `layout_key`,
`expansion` and `pixels` take that count (`images`, per image) after the size, which every caller
passes through `sample_args`; `keep_images` says how many images a truncated sample may keep.

A policy travels in manifests as `to_dict()`; `make_policy` rebuilds it by its `kind`, from the
module `vlmdata.decode.tiling.<kind>` (its `POLICY` class) or a class given to `register_kind`.
"""
from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np

__all__ = ["TiledPolicy", "is_tiled", "register_kind", "sample_args", "tiled_policy"]

_KINDS: dict[str, type] = {}


@dataclass(frozen=True)
class TiledPolicy:
    """Base class of a family's tiling rules (see the module docstring); subclasses are frozen dataclasses."""

    kind: ClassVar[str] = ""
    per_sample: ClassVar[bool] = False  # the layout also depends on the image count of the image's sample
    tile: int = 448                  # tile side in pixels
    patch: int = 14                  # vision patch side
    merge: int = 1                   # vision patches merged into one token per side (cost model)
    image_token_id: int = 0          # the id repeated for image features (and the shard-time placeholder)

    # ---- what a family provides ------------------------------------------------------------------
    def tokens(self, width, height) -> np.ndarray:
        raise NotImplementedError

    def tiles(self, width, height) -> np.ndarray:
        raise NotImplementedError

    def layout_key(self, width: int, height: int):
        """What the expansion depends on (e.g. the tile grid); expansions are cached by it."""
        raise NotImplementedError

    def build_expansion(self, key) -> np.ndarray:
        """The int64 ids replacing a placeholder for images of this layout key."""
        raise NotImplementedError

    def pixels(self, image, resample: int) -> np.ndarray:
        """(n, tile, tile, 3) uint8 tiles of an RGB PIL image (orientation applied), processor order."""
        raise NotImplementedError

    def keep_images(self, total: int, kept: int) -> int:
        """How many images a sample of `total` truncated after `kept` of them keeps (per_sample policies:
        fewer when `kept` would give the kept images another layout than the one they were decoded for)."""
        return kept

    # ---- shared ----------------------------------------------------------------------------------
    def expansion(self, width: int, height: int, *images: int) -> np.ndarray:
        key = self.layout_key(int(width), int(height), *(int(n) for n in images))
        cache = self.__dict__.setdefault("_expansions", {})
        ids = cache.get(key)
        if ids is None:
            ids = np.asarray(self.build_expansion(key), dtype=np.int64)
            ids.setflags(write=False)
            cache[key] = ids
        return ids

    def target_size(self, width: int, height: int) -> tuple[int, int]:
        """For code that asks every policy for one size: the tile side (each tile's size)."""
        return self.tile, self.tile

    def grid(self, width: int, height: int) -> tuple[int, int]:
        return self.tile // self.patch, self.tile // self.patch

    def to_dict(self) -> dict:
        return {"kind": self.kind, **asdict(self)}

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_expansions"}

    def __setstate__(self, state):
        self.__dict__.update(state)


def is_tiled(policy) -> bool:
    return isinstance(policy, TiledPolicy)


def sample_args(policy, images) -> tuple:
    """The extra arguments of `policy`'s per-image calls: `(images,)` (the image count of each image's
    sample, a callable computing it on demand) for a per_sample policy, else ()."""
    if not getattr(policy, "per_sample", False):
        return ()
    return (images() if callable(images) else images,)


def register_kind(cls: type) -> type:
    """Make `make_policy` rebuild `cls` from its `to_dict()` (by `cls.kind`); returns `cls` (a decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, TiledPolicy) and cls.kind):
        raise TypeError(f"{cls!r} is not a TiledPolicy subclass with a kind")
    _KINDS[cls.kind] = cls
    return cls


def tiled_policy(spec: dict) -> TiledPolicy | None:
    """The tiled policy a `to_dict()` describes, or None when its kind is not a tiled one."""
    kind = spec.get("kind")
    if not isinstance(kind, str) or not kind.isidentifier():
        return None
    cls = _KINDS.get(kind)
    if cls is None:
        try:
            module = importlib.import_module(f"vlmdata.decode.tiling.{kind}")
        except ModuleNotFoundError as exc:
            if exc.name != f"vlmdata.decode.tiling.{kind}":
                raise
            return None
        cls = getattr(module, "POLICY", None)
        if cls is None:
            return None
    return cls(**{k: _frozen(v) for k, v in spec.items() if k != "kind"})


def _frozen(value):
    """JSON lists as (nested) tuples: policies are hashable frozen dataclasses."""
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value
