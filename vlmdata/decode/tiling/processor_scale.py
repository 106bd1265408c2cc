"""An image processor's rescale and normalisation of uint8 pixels, done as one lookup table, bit for bit.

transformers' PIL backend rescales in float64 (`x.astype(float64) * rescale_factor`, cast to float32) and
then normalises in float32 (`(x - mean) / std`, mean and std cast to float32), channel-first. For a uint8
pixel that is a function of its channel and its value: 3 x 256 numbers, computed here with the same numpy
arithmetic and applied per channel (`np.take`), which costs a fraction of the two float passes over the
image. The generic family's processor policy (`decode.tiling.processor`) runs the image processor with
`do_rescale=False, do_normalize=False` and applies the table, where `table_for` says it may:

- the image processor is a PIL backend whose rescale and normalize are transformers' own (not overridden)
  and that rescales and normalises at all;
- on probe images (a blank one and noise, several sizes), the processor run whole gives the same
  pixel_values bit for bit as the stopped image step plus the table (checked once per process).

Otherwise (None) the image processor runs its own steps.
"""
from __future__ import annotations

import numpy as np
from PIL import Image

__all__ = ["STOP_BEFORE_SCALE", "apply_table", "table_for"]

STOP_BEFORE_SCALE = {"do_rescale": False, "do_normalize": False}
_PROBES = ((57, 223), (640, 480), (333, 1000))
_TABLES: dict[tuple, np.ndarray | None] = {}        # (folder, files) -> table or None, per process


def scale_table(factor: float, mean, std) -> np.ndarray:
    """float32 [3, 256]: each channel's value of each uint8 after rescale by `factor` and normalisation."""
    values = (np.arange(256, dtype=np.uint8).astype(np.float64) * factor).astype(np.float32)
    return (values[None, :] - np.asarray(mean, np.float32)[:, None]) / np.asarray(std, np.float32)[:, None]


def apply_table(pixels: np.ndarray, table: np.ndarray) -> np.ndarray:
    """uint8 [..., 3, H, W] -> float32 through `table` (channel axis -3)."""
    channels = np.ascontiguousarray(np.moveaxis(pixels, -3, 0))     # np.take is slow on strided indices
    return np.stack([np.take(table[c], channels[c]) for c in range(3)], axis=-3)


def _eligible(ip) -> bool:
    from transformers.image_processing_backends import PilBackend

    cls = type(ip)
    return (isinstance(ip, PilBackend) and cls.rescale is PilBackend.rescale and cls.normalize is PilBackend.normalize
            and bool(getattr(ip, "do_rescale", False)) and bool(getattr(ip, "do_normalize", False)))


def _three(value) -> tuple[float, ...] | None:
    values = value if isinstance(value, (list, tuple)) else [value] * 3
    return tuple(float(v) for v in values) if len(values) == 3 else None


def table_for(policy) -> np.ndarray | None:
    """The table for `policy`'s processor, or None where it may not replace its steps (module docstring);
    checked once per process and processor folder."""
    key = (policy.folder, tuple(map(tuple, policy.files)))
    if key not in _TABLES:
        _TABLES[key] = _verified(policy)
    return _TABLES[key]


def _verified(policy) -> np.ndarray | None:
    proc = policy.processor()
    ip = proc.image_processor
    if not _eligible(ip):
        return None
    mean, std = _three(ip.image_mean), _three(ip.image_std)
    if mean is None or std is None:
        return None
    table = scale_table(float(ip.rescale_factor), mean, std)
    rng = np.random.default_rng(0)
    for w, h in _PROBES:
        for image in (Image.new("RGB", (w, h)), Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))):
            want = policy.run(image)[1]["pixel_values"]
            kwargs = {**policy.image_kwargs(), **STOP_BEFORE_SCALE}
            stopped = np.asarray(proc._process_images([image], **kwargs)[0]["pixel_values"])
            if stopped.dtype != np.uint8 or stopped.shape != want.shape or stopped.shape[-3] != 3:
                return None
            got = apply_table(stopped, table)
            if got.dtype != want.dtype or not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                return None
    return table
