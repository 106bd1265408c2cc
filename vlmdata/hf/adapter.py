"""Output adapters: a PackedBatch becomes the keyword arguments of a Hugging Face VLM's `forward`.

An adapter works in two steps, so that each runs where it is cheapest:

1. `adapter(pack)` — in the DataLoader workers, on the CPU (pass the adapter to
   `make_loader(ds, adapter=...)`): reshapes the flat [T] tensors to [1, T],
   computes Qwen2-VL's 3-D M-RoPE `position_ids` per packed sample
   (`vlmdata.hf.mrope`), puts the sample boundaries in the form transformers'
   packed path reads (`cu_seq_lens_q/k`, `max_length_q/k`), renames the image
   fields (`image_grid` -> `image_grid_thw`), and moves the non-tensor parts of
   the pack (`sample_keys`, `stats`, `state`) under one key, `META_KEY`. Pixels
   stay uint8: 4x fewer bytes to pin and copy to the GPU than float32.
2. `adapter.finalize(batch, device, dtype)` — in the training process, after
   (or while) moving the batch to the device: drops `META_KEY` (read it first
   with `take_meta`), normalises the pixels there with the model's mean/std
   and lays them out as the model's processor does (`vlmdata.hf.pixels`), and,
   for attention implementations that ignore `cu_seq_lens_*` (sdpa, eager),
   adds the 4-D block-diagonal causal `attention_mask`
   (`vlmdata.hf.boundaries`). What it returns holds only tensors and ints: it
   is what `model(**inputs)` takes.

What reaches `forward` (pack mode; B = 1, T tokens, N patches, n images):

| key | Qwen2-VL / Qwen2.5-VL / Qwen3-VL | LLaVA-1.5 |
|---|---|---|
| `input_ids`, `labels` | int64 [1, T] | int64 [1, T] |
| `mm_token_type_ids` | Qwen3-VL: int64 [1, T], 1 on image tokens, 2 on video tokens | — |
| `position_ids` | int64 [3, 1, T] (M-RoPE, per sample) | int64 [1, T] (restart per sample) |
| `pixel_values` | [N, 3*t*p*p] normalised (processor layout) | [n, 3, S, S] normalised |
| `image_grid_thw` | int64 [n, 3] | — |
| `pixel_values_videos` | [V, 3*t*p*p] normalised, clip after clip | — |
| `video_grid_thw` | int64 [v, 3] | — |
| `second_per_grid_ts` | Qwen2.5-VL: float32 [v] | — |
| `cu_seq_lens_q/k`, `max_length_q/k` | int32 [n+1], int | int32 [n+1], int |
| `attention_mask` | [1, 1, T, T] for sdpa/eager | [1, 1, T, T] for sdpa/eager |

The generic family (`ProcessorAdapter`) gives `input_ids`, `labels`, 1-D `position_ids`, the boundaries and
mask, and exactly the keys its processor returns for the pack's images (`pixel_values`, `image_sizes`, ...).

Gemma 3 (`vlmdata.hf.gemma3_adapter`): `pixel_values` [n, 3, S, S], `token_type_ids`, 1-D positions,
and per-layer-type masks `{"full_attention", "sliding_attention"}` for sdpa/eager.

InternVL (`InternVLAdapter`, a tiled family) gets LLaVA's keys with `pixel_values` [tiles, 3, S, S]:
each image's tiles in processor order, normalised with its mean/std.


Idefics3 / SmolVLM (`Idefics3Adapter`): `pixel_values` [1, N tiles, 3, S, S] normalised,
`pixel_attention_mask` bool [1, N, S, S], `position_ids` [1, T] restarting per sample, the boundaries
as above.

Packs without images carry no image keys (the model then runs text only).
Bucket-mode packs ([B, L] rows padded to the longest, with a 2-D
`attention_mask`) keep the padded layout: the model's own padded path applies,
M-RoPE positions are computed per row, and no boundary keys are added.

Labels stay position-aligned (the model shifts them); every packed sample's
first label is -100 (collate), so no token is ever predicted across a sample
boundary.
"""
from __future__ import annotations

import importlib
from dataclasses import replace

import torch

from vlmdata.decode.tiling.processor import PROCESSOR_PREFIX
from vlmdata.errors import AdapterError
from vlmdata.hf.boundaries import MASKED, attention_kind, block_causal_mask, flash_kwargs
from vlmdata.hf.mrope import mrope_position_ids
from vlmdata.hf.pixels import clip_pixels, fixed_to_patches, qwen_patches, video_patches
from vlmdata.hf.spec import ModelSpec

__all__ = ["META_KEY", "HFBatchAdapter", "Idefics3Adapter", "InternVLAdapter", "LlavaAdapter", "ProcessorAdapter", "Qwen3VLAdapter",
           "QwenVLAdapter", "TiledAdapter", "make_adapter", "take_meta", "text_attention"]

META_KEY = "vlmdata"
# family -> (module, class) of the adapters that live in their own module (vlmdata/hf/<family>_adapter.py)
FAMILY_ADAPTERS = {"gemma3": ("vlmdata.hf.gemma3_adapter", "Gemma3Adapter"),
                   "llava-onevision": ("vlmdata.hf.llava_onevision_adapter", "LlavaOnevisionAdapter")}
_META_FIELDS = ("sample_keys", "stats", "state")


def take_meta(batch: dict) -> dict | None:
    """Remove and return the pack's non-tensor parts (sample_keys, stats, state) from an adapted batch."""
    return batch.pop(META_KEY, None)


def _text_config(model):
    config = getattr(model, "config", None)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def text_attention(model) -> str:
    """The attention implementation of a transformers model's language model."""
    config = getattr(model, "config", None)
    if config is None:
        raise AdapterError(f"{type(model).__name__} has no transformers config")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", None) or "eager"


class HFBatchAdapter:
    """Turns PackedBatches into a model family's forward inputs; see the module docstring.

    `spec`: the model family's facts (`ModelSpec.from_folder`); `attn_implementation`: the text
    model's attention ("flash_attention_2", "sdpa", "eager"), which decides how the boundaries travel.
    Picklable: it goes to the DataLoader workers with the dataset.
    """

    family: tuple[str, ...] = ()
    processor_pixels = False      # True: packs hold the image processor's float pixels, normalised by it

    def __init__(self, spec: ModelSpec, attn_implementation: str = "sdpa"):
        if self.family and spec.family not in self.family:
            raise AdapterError(f"{type(self).__name__} serves {', '.join(self.family)}, not {spec.family}")
        self.spec = spec
        self.attn_implementation = attn_implementation
        self.kind = attention_kind(attn_implementation)

    @classmethod
    def for_model(cls, spec: ModelSpec, model) -> HFBatchAdapter:
        """The adapter for `spec` matching a loaded model's attention implementation."""
        if spec.sliding_window is None and isinstance(getattr(_text_config(model), "sliding_window", None), int):
            spec = replace(spec, sliding_window=int(_text_config(model).sliding_window))
        return make_adapter(spec, text_attention(model))

    def fingerprint(self) -> dict:
        """What the adapter changes in a pack (for the tuning cache's dataset fingerprint)."""
        return {"family": self.spec.family, "attention": self.attn_implementation}

    # ---- step 1: in the DataLoader workers ----------------------------------------------------------
    def __call__(self, pack: dict) -> dict:
        if "image_bytes" in pack:
            raise AdapterError("the pack holds encoded images (defer_decode): decode them before the adapter "
                               "(DatasetOptions(defer_decode=False), or run the GPU decode stage first)")
        if "video_bytes" in pack:
            raise AdapterError("the pack holds encoded clips (defer_decode): decode them before the adapter "
                               "(DatasetOptions(defer_decode=False), or run decode.dali.video.DaliVideoStage first)")
        packed = "cu_seqlens" in pack
        if not packed and "attention_mask" not in pack:
            raise AdapterError(f"not a PackedBatch (no cu_seqlens, no attention_mask): keys {sorted(pack)}")
        out = {"input_ids": _rows(pack["input_ids"]), "labels": _rows(pack["labels"])}
        if packed:
            out.update(flash_kwargs(pack["cu_seqlens"], int(pack["max_seqlen"])))
        else:
            out["attention_mask"] = pack["attention_mask"]
        out.update(self.images(pack))
        out["position_ids"] = self.positions(pack, out)
        meta = {k: pack[k] for k in _META_FIELDS if k in pack}
        if meta:
            out[META_KEY] = meta
        return out

    def images(self, pack: dict) -> dict:
        """The image keys of the host batch (uint8, family layout), or {} when the pack has no image."""
        raise NotImplementedError

    def positions(self, pack: dict, host: dict) -> torch.Tensor:
        """position_ids of the host batch."""
        raise NotImplementedError

    # ---- step 2: on the device ----------------------------------------------------------------------
    def finalize(self, batch: dict, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> dict:
        """Forward keyword arguments: on `device`, pixels normalised to `dtype`, the 4-D mask when needed."""
        inputs = {k: v for k, v in batch.items() if k != META_KEY}
        if device is not None:
            inputs = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                      for k, v in inputs.items()}
        if "pixel_values" in inputs:
            inputs["pixel_values"] = self.normalise(inputs["pixel_values"], dtype)
        if self.kind == MASKED and "cu_seq_lens_q" in inputs and "attention_mask" not in inputs:
            inputs["attention_mask"] = self.packed_mask(inputs, dtype if self.attn_implementation == "eager" else None)
        for k, v in inputs.items():
            if not (isinstance(v, (torch.Tensor, int)) or _tensor_dict(v)):
                raise AdapterError(f"forward input {k!r} is a {type(v).__name__}: only tensors and ints reach "
                                   "the model")
        return inputs

    def packed_mask(self, inputs: dict, additive: torch.dtype | None):
        """The sdpa/eager mask of a pack: [1, 1, T, T] block-diagonal causal (`hf.boundaries`); boolean, or
        additive in `additive` (eager). A family whose model takes per-layer-type masks returns a dict."""
        return block_causal_mask(inputs["cu_seq_lens_q"], inputs["input_ids"].shape[-1], additive,
                                 inputs["input_ids"].device)

    def normalise(self, pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """uint8 host pixels -> the vision tower's input."""
        raise NotImplementedError


class QwenVLAdapter(HFBatchAdapter):
    """Qwen2-VL and Qwen2.5-VL (and Qwen3-VL's base): flattened patches + image_grid_thw, videos' patches +
    video_grid_thw (+ second_per_grid_ts for Qwen2.5-VL), 3-D M-RoPE positions with time."""

    family = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl")

    def images(self, pack: dict) -> dict:
        out = self.videos(pack)
        pixels = pack.get("pixel_values")
        if pixels is None or pixels.shape[0] == 0:
            return out
        return {**self.still_images(pack, pixels), **out}

    def videos(self, pack: dict) -> dict:
        """The video keys (uint8 rows, grids, Qwen2.5-VL's seconds per temporal patch), {} without clips."""
        rows = pack.get("pixel_values_videos")
        if rows is None or rows.shape[0] == 0:
            return {}
        if self.spec.video_token_id is None:
            raise AdapterError(f"the pack holds videos but the {self.spec.family} spec names no video_token_id")
        grid = pack["video_grid"].to(torch.int64).reshape(-1, 3)
        if int(grid.prod(dim=1).sum()) != rows.shape[0]:
            raise AdapterError(f"video_grid gives {int(grid.prod(dim=1).sum())} patches but the pack has "
                               f"{rows.shape[0]}")
        out = {"pixel_values_videos": rows, "video_grid_thw": grid}
        if self.spec.family == "qwen2.5-vl":
            out["second_per_grid_ts"] = pack["second_per_grid_ts"].to(torch.float32)
        return out

    def video_interval(self, host: dict) -> torch.Tensor | None:
        """Each video's temporal position step: Qwen2.5-VL's tokens_per_second * second_per_grid_t."""
        if self.spec.family != "qwen2.5-vl" or "second_per_grid_ts" not in host:
            return None
        tps = self.spec.tokens_per_second if self.spec.tokens_per_second is not None else 4   # the config default
        return host["second_per_grid_ts"].to(torch.float32) * tps

    def rope_video_grids(self, host: dict) -> torch.Tensor | None:
        """The video grids the rope index walks: one per video."""
        return host.get("video_grid_thw")

    def still_images(self, pack: dict, pixels: torch.Tensor) -> dict:
        spec = self.spec
        if pixels.dim() == 4:
            rows, grid = fixed_to_patches(pixels, spec.patch_size, spec.merge_size)
        else:
            if "image_grid" not in pack:
                raise AdapterError("flattened patches without image_grid: the pack lost its per-image grids")
            rows, grid = pixels, pack["image_grid"].to(torch.int64).reshape(-1, 3)
            if int(grid.prod(dim=1).sum()) != rows.shape[0]:
                raise AdapterError(f"image_grid gives {int(grid.prod(dim=1).sum())} patches but the pack has "
                                   f"{rows.shape[0]}")
        return {"pixel_values": rows, "image_grid_thw": grid}

    def positions(self, pack: dict, host: dict) -> torch.Tensor:
        grid = host.get("image_grid_thw")
        ids = pack["input_ids"]
        video = {"video_grid_thw": self.rope_video_grids(host), "video_token_id": self.spec.video_token_id,
                 "video_interval": self.video_interval(host)}
        if "cu_seqlens" in pack:
            pos = mrope_position_ids(ids, pack["cu_seqlens"], grid, self.spec.image_token_id, self.spec.merge_size,
                                     **video)
            return pos[:, None, :]
        lengths = pack["attention_mask"].sum(dim=1).to(torch.int64)   # rows: real tokens first, then padding
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        real = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
        flat = mrope_position_ids(ids[real], cu, grid, self.spec.image_token_id, self.spec.merge_size, **video)
        pos = torch.zeros(3, *ids.shape, dtype=torch.int64)
        pos[:, real] = flat
        return pos

    def finalize(self, batch: dict, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> dict:
        inputs = super().finalize(batch, device, dtype)
        if "pixel_values_videos" in inputs:
            inputs["pixel_values_videos"] = video_patches(inputs["pixel_values_videos"], self.spec.image_mean,
                                                          self.spec.image_std, dtype)
        return inputs

    def normalise(self, pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        spec = self.spec
        return qwen_patches(pixels, spec.patch_size, spec.temporal_patch_size, spec.image_mean, spec.image_std,
                            dtype)


class Qwen3VLAdapter(QwenVLAdapter):
    """Qwen3-VL: Qwen2-VL's inputs plus the processor's `mm_token_type_ids` (1 on image tokens, 2 on video
    tokens, else 0), which the model asks for whenever it computes positions itself. Its rope index takes
    each temporal patch of a video as a one-frame grid (t = 1, the timestamps between them are text)."""

    family = ("qwen3-vl",)

    def __call__(self, pack: dict) -> dict:
        out = super().__call__(pack)
        ids = out["input_ids"]
        kinds = (ids == self.spec.image_token_id).to(torch.int64)
        if self.spec.video_token_id is not None:
            kinds[ids == self.spec.video_token_id] = 2
        out["mm_token_type_ids"] = kinds
        return out

    def rope_video_grids(self, host: dict) -> torch.Tensor | None:
        grid = host.get("video_grid_thw")
        if grid is None:
            return None
        frames = torch.repeat_interleave(grid, grid[:, 0], dim=0)
        frames[:, 0] = 1
        return frames


class LlavaAdapter(HFBatchAdapter):
    """LLaVA-1.5: [n, 3, S, S] CLIP-normalised images, 1-D positions restarting per sample."""

    family = ("llava",)

    def images(self, pack: dict) -> dict:
        pixels = pack.get("pixel_values")
        if pixels is None or pixels.shape[0] == 0:
            return {}
        if pixels.dim() != 4:
            raise AdapterError("LLaVA takes whole images [n, 3, S, S]: load the dataset with "
                               f"image_size=FixedPolicy({self.spec.image_size}), not a dynamic policy")
        size = self.spec.image_size
        if pixels.shape[2] != size or pixels.shape[3] != size:
            raise AdapterError(f"images are {pixels.shape[2]}x{pixels.shape[3]} but the vision tower takes "
                               f"{size}x{size}: load the dataset with image_size={size}")
        return {"pixel_values": pixels}

    def positions(self, pack: dict, host: dict) -> torch.Tensor:
        return _rows(pack["position_ids"])

    def normalise(self, pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        spec = self.spec
        return clip_pixels(pixels, int(spec.image_size), spec.image_mean, spec.image_std, dtype)


class TiledAdapter(HFBatchAdapter):
    """Tiled families (`decode.tiled`): [tiles, 3, S, S] normalised tiles in processor order, 1-D
    positions restarting per sample; a subclass adds its family's keys (`tile_keys`) and layout."""

    def images(self, pack: dict) -> dict:
        pixels = pack.get("pixel_values")
        if pixels is None or pixels.shape[0] == 0:
            return {}
        if pixels.dim() != 4 or "image_tiles" not in pack:
            raise AdapterError(f"{self.spec.family} takes tiles [n, 3, S, S] with image_tiles: load the dataset "
                               "with its own image policy (image_size=None)")
        tile = int(self.spec.policy["tile"])
        if pixels.shape[2] != tile or pixels.shape[3] != tile:
            raise AdapterError(f"tiles are {pixels.shape[2]}x{pixels.shape[3]} but {self.spec.family} takes "
                               f"{tile}x{tile}")
        return {"pixel_values": pixels, **self.tile_keys(pack)}

    def tile_keys(self, pack: dict) -> dict:
        """The family's keys besides pixel_values (tile counts, image sizes, masks)."""
        return {}

    def positions(self, pack: dict, host: dict) -> torch.Tensor:
        return _rows(pack["position_ids"])

    def normalise(self, pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        spec = self.spec
        return clip_pixels(pixels, int(spec.policy["tile"]), spec.image_mean, spec.image_std, dtype)


class ProcessorAdapter(HFBatchAdapter):
    """The generic family (`decode.tiling.processor`): the model gets exactly what its processor returns for
    the pack's images: `pixel_values` (already normalised by the image processor, float32: 4x the bytes of
    the native families' uint8 across the DataLoader) and the pack's `processor_<key>` fields under the
    processor's names (e.g. `image_sizes`); 1-D positions restarting per sample."""

    family = ("generic",)
    processor_pixels = True

    def images(self, pack: dict) -> dict:
        if "pixel_values" not in pack:
            return {}
        out = {"pixel_values": pack["pixel_values"]}
        out.update({k[len(PROCESSOR_PREFIX):]: v for k, v in pack.items() if k.startswith(PROCESSOR_PREFIX)})
        return out

    def positions(self, pack: dict, host: dict) -> torch.Tensor:
        return _rows(pack["position_ids"])

    def normalise(self, pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return pixels.to(dtype)


def interleave_frames(tiles: torch.Tensor | None, image_tiles: torch.Tensor | None, rows: torch.Tensor,
                      frames: torch.Tensor, images_before: torch.Tensor, tile: int) -> torch.Tensor:
    """Image tiles [n, 3, S, S] (`image_tiles` per image) and clips' frame rows [F, 3*S*S] (`frames` per clip)
    -> [n + F, 3, S, S] in token order: clip j's frames after the tiles of the pack's first `images_before[j]`
    images, as InternVLProcessor merges video frames into `pixel_values`."""
    if rows.dim() != 2 or rows.shape[1] != 3 * tile * tile or int(frames.sum()) != rows.shape[0]:
        raise AdapterError(f"video rows {list(rows.shape)} are not {int(frames.sum())} frames of 3x{tile}x{tile}")
    counts = image_tiles.to(torch.int64) if image_tiles is not None else torch.zeros(0, dtype=torch.int64)
    tile_at = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).tolist()
    frame_at = torch.cat([torch.zeros(1, dtype=torch.int64), frames.to(torch.int64).cumsum(0)]).tolist()
    frame_tiles = rows.reshape(-1, 3, tile, tile)
    pieces, done = [], 0
    for j, before in enumerate(images_before.tolist()):
        if not done <= before < len(tile_at):
            raise AdapterError(f"clip {j} follows {before} images but the pack's clips and images are not in order")
        pieces += [tiles[tile_at[done]:tile_at[before]]] if before > done else []
        pieces.append(frame_tiles[frame_at[j]:frame_at[j + 1]])
        done = before
    if tiles is not None and tile_at[done] < len(tiles):
        pieces.append(tiles[tile_at[done]:])
    return torch.cat(pieces)


class InternVLAdapter(TiledAdapter):
    """InternVL3 / InternVL3.5 (`InternVLForConditionalGeneration`): `pixel_values` [tiles, 3, 448, 448], every
    image's grid row by row then its thumbnail, normalised as GotOcr2ImageProcessor does (ImageNet mean/std);
    no tile counts or image sizes (the model scatters tile features over the `<IMG_CONTEXT>` tokens in order,
    image_seq_length per tile, and its vision tower attends within a tile, so samples never meet there).
    A clip's frames are tiles too (`video.internvl_policy`): they join `pixel_values` between the images'
    tiles in token order (`interleave_frames`), as InternVLProcessor merges them."""

    family = ("internvl",)

    def images(self, pack: dict) -> dict:
        out = super().images(pack)
        rows = pack.get("pixel_values_videos")
        if rows is None or not rows.shape[0]:
            return out
        tiles = out.get("pixel_values")
        frames = pack["video_grid"].to(torch.int64).reshape(-1, 3)[:, 0]
        return {**out, "pixel_values": interleave_frames(tiles, pack.get("image_tiles") if tiles is not None else None,
                                                         rows, frames, pack["video_images_before"],
                                                         int(self.spec.policy["tile"]))}


class Idefics3Adapter(TiledAdapter):
    """Idefics3 and SmolVLM: the tiles (each image's row-major tiles, then its global image) as
    `pixel_values` [1, N, 3, S, S] and `pixel_attention_mask` [1, N, S, S], all true (every tile is a full
    S x S crop: the processor's batch padding never pads one). The model flattens batch and image axes, so
    one row of N tiles serves a pack of many samples; the image features fill the `<image>` tokens in order."""

    family = ("idefics3", "smolvlm")

    def normalise(self, pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return super().normalise(pixels, dtype).unsqueeze(0)

    def finalize(self, batch: dict, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> dict:
        inputs = super().finalize(batch, device, dtype)
        pixels = inputs.get("pixel_values")
        if pixels is not None:
            n, side = pixels.shape[1], pixels.shape[-1]
            inputs["pixel_attention_mask"] = torch.ones((1, n, side, side), dtype=torch.bool, device=pixels.device)
        return inputs


def make_adapter(spec: ModelSpec, attn_implementation: str = "sdpa") -> HFBatchAdapter:
    """The adapter of `spec`'s family."""
    if spec.family in FAMILY_ADAPTERS:          # a family's own module (it imports this one: found by name)
        module, name = FAMILY_ADAPTERS[spec.family]
        return getattr(importlib.import_module(module), name)(spec, attn_implementation)
    if spec.family == "internvl":
        return InternVLAdapter(spec, attn_implementation)
    if spec.family in Idefics3Adapter.family:
        return Idefics3Adapter(spec, attn_implementation)
    cls = Qwen3VLAdapter if spec.family == "qwen3-vl" else QwenVLAdapter if spec.is_qwen else LlavaAdapter
    if spec.family == "generic":
        cls = ProcessorAdapter
    return cls(spec, attn_implementation)


def _tensor_dict(v) -> bool:
    """A mapping of tensors (per-layer-type attention masks, which transformers uses as given)."""
    return isinstance(v, dict) and bool(v) and all(isinstance(x, torch.Tensor) for x in v.values())


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[T] -> [1, T]; [B, L] stays."""
    return x.reshape(1, -1) if x.dim() == 1 else x
