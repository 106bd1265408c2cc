"""The video settings a tiled family lays out: N uniform frames, each one tile, normalised as the images.

LLaVA-OneVision and InternVL take a clip as `num_frames` frames resized to the image tile; vlmdata normalises
frames with the image mean/std (for InternVL they even share `pixel_values` with the image tiles). A folder's
video processor config that asks for something else (sampling by fps, another frame size, other mean/std)
cannot be laid out this way: `tile_video_settings` says why (ConfigError), and `laid_out_or_warn` turns that
into a warning and no video layout (the family's video rows are then `video_unsupported`; images unaffected).
"""
from __future__ import annotations

import logging

from vlmdata.errors import ConfigError

__all__ = ["laid_out_or_warn", "square_side", "tile_video_settings"]

log = logging.getLogger(__name__)


def square_side(value) -> int | None:
    """One side of a square size given as an int, a [h, w] list or a {"height", "width"} dict."""
    if isinstance(value, dict):
        value = (value.get("height"), value.get("width"))
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise ConfigError(f"tiles are square; got a size of {list(value)}")
        value = value[0]
    return None if value is None else int(value)


def tile_video_settings(path: str, vp: dict, tile: int, mean: tuple, std: tuple, default_mean: tuple,
                        default_std: tuple) -> tuple[int | None, int]:
    """(num_frames or None, resample) of a folder's video config `vp` ({} when it ships none: the images'
    settings apply); ConfigError for a config vlmdata cannot lay out. `default_mean` / `default_std`: the
    video processor class's own defaults, which apply when `vp` names none."""
    if vp.get("fps") and not vp.get("num_frames"):
        raise ConfigError(f"{path}: the video processor samples by fps; vlmdata lays out videos of num_frames "
                          "uniform frames (set num_frames)")
    for key, want, default in (("image_mean", mean, default_mean), ("image_std", std, default_std)):
        given = vp.get(key, default) if vp else want
        if tuple(float(x) for x in given) != tuple(float(x) for x in want):
            raise ConfigError(f"{path}: the video processor's {key} {list(given)} differs from the image "
                              f"processor's {list(want)} (vlmdata normalises both alike)")
    side = square_side(vp.get("size")) if isinstance(vp.get("size"), (dict, int, list)) else None
    if side is not None and side != tile:
        raise ConfigError(f"{path}: video frames of {vp['size']} are not the {tile} px tile")
    num = vp.get("num_frames")
    return (int(num) if num else None), int(vp.get("resample", 3))


def laid_out_or_warn(make, family):
    """`make()` (a video policy dict), or None with a warning when it raises ConfigError (kept as the
    family's `video_unsupported_reason`, which each skipped row's detail gives)."""
    try:
        return make()
    except ConfigError as exc:
        log.warning("%s; its video rows are skipped as video_unsupported", exc)
        family._video_reason = str(exc)
        return None
