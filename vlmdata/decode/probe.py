"""Would the loader decode this file? The question the shard gate asks, answered by the loader's own library.

Every CPU decoder of the loader ends in `PillowDecoder` (TurboJPEG and DALI
hand it every image they cannot do), so a file reaches training exactly when
Pillow, as the loader calls it, decodes it: `open_image` (the formats in
`loader_formats()`, the same `ImageFile.LOAD_TRUNCATED_IMAGES` of the process),
`load()`, `convert("RGB")`. `probe_decode` asks exactly that, cheaply:

- a JPEG is decoded at 1/8 scale (`Image.draft`: libjpeg still reads every
  entropy-coded byte, so a truncated scan or a body of garbage fails as it
  would at full size, but the inverse DCT and colour conversion work on 1/64
  of the pixels);
- any other format is loaded whole (there is no cheaper way to inflate a
  PNG), and the conversion to RGB is tried on one pixel (it depends on the
  mode only).

Formats: every format the installed Pillow opens (PPM/PGM/PBM, ICO, BMP, GIF,
TIFF, WebP, PNG, JPEG 2000, TGA, PCX, QOI, ...) except EPS, which Pillow
decodes by running Ghostscript on the file: the loader never starts another
program on a dataset's bytes, so EPS is refused ("unsupported_format").

Reasons, as counted: no format identifies the bytes -> not_an_image; a format
the loader does not decode -> unsupported_format; a header without a size ->
bad_image_header; more pixels than the limit -> decompression_bomb; Pillow's
"image file is truncated" -> truncated_image; any other exception of the
decode -> undecodable_image. Details never quote the file's bytes (`scrub`).
"""
from __future__ import annotations

import functools
import io
import re
import warnings

from vlmdata.errors import ImageProblem, Skip

__all__ = ["EXCLUDED_FORMATS", "loader_formats", "open_image", "probe_decode", "scrub"]

EXCLUDED_FORMATS = frozenset({"EPS"})    # decoded by running Ghostscript (see the module docstring)
_BYTES_LITERAL = re.compile(r"""b(['"]).*?(?<!\\)\1""")


def scrub(message: str) -> str:
    """A decoder's error message without quoted bytes of the file (e.g. Pillow's "broken PNG file (chunk b'..')")."""
    return _BYTES_LITERAL.sub("b'...'", message)[:200]


@functools.lru_cache(maxsize=1)
def loader_formats() -> tuple[str, ...]:
    """The Pillow format names the loader decodes: every plugin of this Pillow but `EXCLUDED_FORMATS`, in
    Pillow's own order (`Image.ID`, the order `Image.open` tries them in, so a file two plugins accept is
    opened by the same one as in a plain `Image.open`, e.g. in a Hugging Face image processor)."""
    from PIL import Image

    Image.init()
    return tuple(f for f in Image.ID if f in Image.OPEN and f not in EXCLUDED_FORMATS)


def open_image(data):
    """`Image.open` of encoded bytes, limited to `loader_formats()` (lazy: only the header is read)."""
    from PIL import Image

    return Image.open(io.BytesIO(data), formats=loader_formats())


def probe_decode(data, max_pixels: int) -> tuple[str, tuple[int, int]]:
    """(Pillow format, stored (w, h)) when the loader decodes `data`; else ImageProblem with the reason."""
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # bomb warnings (checked below), palette transparency notes
        try:
            img = open_image(data)
        except Image.UnidentifiedImageError:
            raise _unidentified(data) from None
        except Image.DecompressionBombError as exc:   # Pillow's own limit (twice its warning threshold)
            raise ImageProblem(Skip.DECOMPRESSION_BOMB, scrub(str(exc))) from None
        except Exception as exc:   # a header parser's exception of any type: the header is unusable
            raise ImageProblem(Skip.BAD_IMAGE_HEADER, f"{type(exc).__name__}: {scrub(str(exc))}") from None
        with img:
            fmt, (w, h) = img.format, img.size
            if w <= 0 or h <= 0:
                raise ImageProblem(Skip.BAD_IMAGE_HEADER, f"{fmt} header gives size {w}x{h}")
            if w * h > max_pixels:
                raise ImageProblem(Skip.DECOMPRESSION_BOMB, f"{w}x{h} pixels > limit {max_pixels}")
            try:
                if fmt == "JPEG":
                    img.draft("RGB", (max(1, w // 8), max(1, h // 8)))
                img.load()
                img.crop((0, 0, 1, 1)).convert("RGB")
            except Exception as exc:   # any exception of one image's decode is a counted reason
                raise _failed(fmt, exc) from None
    return fmt, (w, h)


def _unidentified(data) -> ImageProblem:
    """not_an_image, or unsupported_format when an excluded plugin would open the bytes."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data), formats=sorted(EXCLUDED_FORMATS)) as img:
            fmt = img.format
    except Exception:   # noqa: BLE001 - no plugin at all identifies these bytes
        return ImageProblem(Skip.NOT_AN_IMAGE, "no image format the loader decodes identifies the bytes")
    return ImageProblem(Skip.UNSUPPORTED_FORMAT, f"{fmt} is not decoded by the loader (it would run a program)")


def _failed(fmt: str, exc: Exception) -> ImageProblem:
    from PIL import Image

    if isinstance(exc, Image.DecompressionBombError):
        return ImageProblem(Skip.DECOMPRESSION_BOMB, scrub(str(exc)))
    if isinstance(exc, OSError) and str(exc).startswith("image file is truncated"):
        return ImageProblem(Skip.TRUNCATED_IMAGE, f"{fmt}: {scrub(str(exc))}")
    return ImageProblem(Skip.UNDECODABLE_IMAGE, f"{fmt} does not decode: {type(exc).__name__}: {scrub(str(exc))}")
