"""Why one image failed to decode, as a skip reason; no exception from one image may end an epoch.

Pillow raises many types on bad files. `failure_reason(exc)` maps them:

- `DecompressionBombError` -> "image_too_large";
- the types a malformed file produces (OSError, SyntaxError, ValueError,
  EOFError, struct.error, IndexError, ZeroDivisionError) -> "corrupt_image";
- anything else (ImportError for a missing codec, MemoryError, TypeError,
  RecursionError, a library bug, ...) -> "decoder_exception", logged once
  per exception type and process with its traceback, so a systematic problem
  (a codec missing from the build) is visible instead of silently dropping data.

Only `Exception`s are absorbed: KeyboardInterrupt and SystemExit still stop the process.
"""
from __future__ import annotations

import logging
import struct

from vlmdata.errors import Skip

__all__ = ["CORRUPT_TYPES", "failure_reason"]

log = logging.getLogger(__name__)

CORRUPT_TYPES: tuple[type[BaseException], ...] = (OSError, SyntaxError, ValueError, EOFError, struct.error,
                                                  IndexError, ZeroDivisionError)
_LOGGED: set[str] = set()


def failure_reason(exc: Exception, decoder: str) -> str:
    """The skip reason for `exc`, raised by `decoder` on one image (unexpected types are logged once)."""
    from PIL import Image

    if isinstance(exc, Image.DecompressionBombError):
        return Skip.IMAGE_TOO_LARGE
    if isinstance(exc, CORRUPT_TYPES):
        return Skip.CORRUPT_IMAGE
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    if name not in _LOGGED:
        _LOGGED.add(name)
        log.warning("the %s decoder raised %s on one image; it is skipped and counted as %r (this is logged "
                    "once per exception type)", decoder, name, Skip.DECODER_EXCEPTION, exc_info=exc)
    return Skip.DECODER_EXCEPTION
