"""Which images DALI decodes and at what size; the rest go to the CPU decoder, image by image.

DALI 2.4 (nvImageCodec) decodes baseline and progressive JPEG (CMYK and YCCK
included), 8-bit PNG (palette, alpha, grey), WebP (the first frame of an
animation), BMP and JPEG 2000 to the pixels Pillow's `convert("RGB")` gives
(checked in tests/decode/test_equivalence.py). It rejects GIF, decodes a
16-bit greyscale PNG by scaling where Pillow clips, returns LAB TIFFs in
wrong colours without failing, and rejects planar TIFFs and some BMPs. So
`cpu_only(data)` sends GIF, TIFF, 16-bit PNG and anything without a signature
DALI knows to the CPU decoder before DALI sees them, and whatever DALI still
fails on goes there afterwards: a format DALI cannot do costs speed, never a
sample. Only an image the CPU decoder rejects too is counted as skipped.

EXIF orientation is applied by vlmdata, not by DALI (`adjust_orientation`
stays off): an image to be turned by 90 degrees is decoded and resized to the
transposed target, then transposed (`vlmdata.orientation`), so DALI and the
CPU decoders agree on what "displayed" means.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field

from vlmdata.decode.dali.pipeline import as_uint8, looks_like_image
from vlmdata.orientation import TRANSPOSING, effective_orientation, read_orientation

__all__ = ["DecodePlan", "cpu_only", "plan_decode"]


def cpu_only(data) -> bool:
    """True for images DALI must not decode (see the module docstring)."""
    head = bytes(data[:26])
    if head[:6] in (b"GIF87a", b"GIF89a") or head[:4] in (b"II*\x00", b"MM\x00*"):
        return True
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return len(head) < 25 or head[24] == 16           # IHDR bit depth
    return not looks_like_image(as_uint8(data))


@dataclass
class DecodePlan:
    """For a list of images: which DALI decodes (with the size to decode to) and the orientation of each."""

    dali: list[int] = field(default_factory=list)
    dali_hw: list[tuple[int, int]] = field(default_factory=list)   # (height, width) in stored pixels
    cpu: list[int] = field(default_factory=list)
    orientation: list[int] = field(default_factory=list)           # to apply after DALI, per input image


def _stored_size(data) -> tuple[int, int] | None:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(bytes(data))) as im:
            return im.size
    except Exception:   # an unreadable header: DALI decides, then the CPU decoder
        return None


def plan_decode(encoded: list, hw: list[tuple[int, int]]) -> DecodePlan:
    """The plan for images `encoded` with displayed targets `hw` ((height, width) each)."""
    plan = DecodePlan()
    for i, (data, (h, w)) in enumerate(zip(encoded, hw)):
        if len(data) == 0 or cpu_only(data):
            plan.cpu.append(i)
            plan.orientation.append(1)
            continue
        o = read_orientation(data)
        if o in TRANSPOSING:
            stored = _stored_size(data)
            o = effective_orientation(o, stored, (w, h)) if stored is not None else o
        elif not 2 <= o <= 8:
            o = 1
        plan.dali.append(i)
        plan.dali_hw.append((w, h) if o in TRANSPOSING else (h, w))
        plan.orientation.append(o)
    return plan
