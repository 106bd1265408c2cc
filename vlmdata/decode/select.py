"""Choosing a decoder by name: "pillow", "dali" or "auto"."""
from __future__ import annotations

from vlmdata.decode.base import ImageDecoder


def make_decoder(name: str = "auto") -> ImageDecoder:
    """A CPU-side decoder usable inside DataLoader workers."""
    if name in ("pillow", "auto"):
        from vlmdata.decode.pillow import PillowDecoder

        return PillowDecoder()
    if name == "dali":
        from vlmdata.decode.dali import DaliCpuDecoder

        return DaliCpuDecoder()
    raise ValueError(f"unknown decoder {name!r}: use 'pillow', 'dali' or 'auto'")
