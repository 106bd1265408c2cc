"""The shard gate for images: a file is kept exactly when the loader's decoders decode it.

`check_image(data, max_pixels, verify)` decides, by `verify` (`vlmdata shard --verify`):

- "structure" (the default): `vlmdata.decode.structure.clean_structure` keeps
  a JPEG or PNG whose container is clean (segments, entropy-coded stuffing,
  end marker; PNG chunk CRCs) without decoding it; every other file, and every
  JPEG or PNG with anything odd, gets the "decode" check below, so nothing the
  loader decodes is refused and a garbage body is refused. What it does not
  prove (the Huffman codes, the zlib stream) is counted at load time.
- "decode": `vlmdata.decode.probe.probe_decode`, the loader's
  own Pillow call with its formats and its `LOAD_TRUNCATED_IMAGES`, at 1/8
  scale for JPEG (see that module). Every format Pillow opens but EPS is kept
  when it decodes (PPM/PGM/PBM, ICO, BMP, GIF, TIFF, WebP, JPEG 2000, ...); a
  truncated scan, a garbage body and a format the loader does not decode are
  counted skips. Sizes are Pillow's, i.e. what the loader will see.
- "strict": the same, and a JPEG must also decode through TurboJPEG with every
  libjpeg warning an error (refuses files Pillow decodes with warnings, e.g.
  a body of noise that happens to parse).
- "none": header checks only (signature, a size, the pixel limit), sizes read
  from the header without Pillow where the format is simple (JPEG SOF, PNG
  IHDR, GIF/WebP/BMP headers); a file that does not decode is left for the
  loader to count as corrupt_image.

There is no end-marker check any more: a JPEG with data after its EOI or a
short APP segment decodes, and whether a missing EOI matters is libjpeg's
call, as it is at load time.

EXIF orientation: recorded (width, height) are the *displayed* dimensions
(EXIF orientation applied: swapped for orientations 5-8, read by
`vlmdata.orientation.read_orientation` without decoding). Every decoder in
this project returns the image as displayed, like stock Pillow's
`ImageOps.exif_transpose(img).convert("RGB")`, so index sizes equal decoded
sizes and the image policy's token counts match the pixels the model sees.
Images kept as original bytes keep their EXIF; a re-encoded image
(`--resize-max-side`, `--quality`) and a memmap image are the displayed
pixels resized, and a re-encoded JPEG carries no orientation tag.

Every exception a decode raises (Pillow raises many types on bad files) is a
counted `ImageProblem`, never the end of the run; its detail never quotes the
file's bytes (`scrub`).
"""
from __future__ import annotations

import io
import struct
import warnings
from dataclasses import dataclass

from vlmdata.decode.probe import open_image, probe_decode, scrub
from vlmdata.decode.structure import clean_structure
from vlmdata.errors import ImageProblem, Skip
from vlmdata.formats.sample import EncodedImage
from vlmdata.orientation import displayed_size, read_orientation

DEFAULT_MAX_PIXELS = 89_478_485  # Pillow's DecompressionBombWarning threshold
MAX_IMAGES_PER_SAMPLE = 32_767   # the sample index stores a sample's image count as int16
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_NO_LENGTH = {0x01, 0xD0, 0xD1, 0xD2, 0xD3, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8}
EXIF_ORIENTATION = 0x0112
VERIFY_MODES = ("structure", "decode", "strict", "none")   # the first is the default (see the module docstring)
_KINDS = {"JPEG": "jpg", "MPO": "jpg", "PNG": "png", "GIF": "gif", "WEBP": "webp", "BMP": "bmp", "TIFF": "tiff",
          "JPEG2000": "jp2"}   # Pillow format -> the extension a kept image is written with (else format.lower())


def sniff(data: bytes) -> str | None:
    """The image type from magic bytes ("jpg", "png", "gif", "webp", "bmp", "tiff", "jp2") or None."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:2] == b"BM":
        return "bmp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if data[:12] == b"\x00\x00\x00\x0cjP  \r\n\x87\n" or data[:4] == b"\xff\x4f\xff\x51":
        return "jp2"
    return None


def jpeg_size(data) -> tuple[int, int] | None:
    """(width, height) from the first SOF marker, or None if it is not in `data`."""
    n = len(data)
    pos = 2
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _NO_LENGTH:
            pos += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame header
            return None
        length = (data[pos + 2] << 8) | data[pos + 3]
        if marker in _SOF:
            if pos + 9 > n:
                return None
            height, width = struct.unpack(">HH", bytes(data[pos + 5:pos + 9]))
            return width, height
        pos += 2 + length
    return None


def header_size(kind: str, data) -> tuple[int, int] | None:
    """(width, height) read from the header of an image of type `kind`; None if unreadable."""
    try:
        if kind == "jpg":
            return jpeg_size(data)
        if kind == "png":
            if bytes(data[12:16]) != b"IHDR":
                return None
            return struct.unpack(">II", bytes(data[16:24]))
        if kind == "gif":
            return struct.unpack("<HH", bytes(data[6:10]))
        if kind == "webp":
            return _webp_size(bytes(data[:30]))
        if kind == "bmp":
            w, h = struct.unpack("<ii", bytes(data[18:26]))
            return abs(w), abs(h)
    except struct.error:
        return None
    return _pil_size(data)


def _webp_size(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8 " and head[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", head[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L" and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        return int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1
    return None


def _pil_header(data) -> tuple[str, tuple[int, int]] | None:
    """(Pillow format, size) from a lazy open with the loader's formats; None if it does not open."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with open_image(bytes(data)) as im:
                return im.format, im.size
    except Exception:   # any exception from a header parser means "no size": skipped as bad_image_header
        return None


def _pil_size(data) -> tuple[int, int] | None:
    header = _pil_header(data)
    return None if header is None else header[1]


@dataclass(frozen=True)
class ImageOptions:
    """What to do with each image: limits and optional re-encode."""

    max_pixels: int = DEFAULT_MAX_PIXELS
    resize_max_side: int | None = None
    quality: int | None = None
    verify: str = VERIFY_MODES[0]


def check_image(data: bytes, max_pixels: int, verify: str = VERIFY_MODES[0]) -> tuple[str, int, int]:
    """Validate encoded bytes as `verify` says; returns (kind, width, height) or raises ImageProblem.

    (width, height) are the displayed dimensions, EXIF orientation applied
    (what the decoders return, see the module docstring).
    """
    if not data:
        raise ImageProblem(Skip.EMPTY_FILE, "zero-byte file")
    if verify == "none":
        kind, size = _header_only(data)
    else:
        clean = clean_structure(data) if verify == "structure" else None
        fmt, size = clean or _decoded(data, max_pixels)
        kind = _KINDS.get(fmt, fmt.lower())
        if verify == "strict" and kind == "jpg":
            _strict_jpeg(data)
    if size[0] * size[1] > max_pixels:
        raise ImageProblem(Skip.DECOMPRESSION_BOMB, f"{size[0]}x{size[1]} pixels > limit {max_pixels}")
    if kind == "tiff":   # Pillow reports a TIFF's displayed size (it turns TIFFs itself when loading)
        return kind, size[0], size[1]
    w, h = displayed_size(size[0], size[1], read_orientation(data))
    return kind, w, h


def _decoded(data: bytes, max_pixels: int) -> tuple[str, tuple[int, int]]:
    """(Pillow format, stored size) when the loader's Pillow call decodes `data`, else ImageProblem."""
    try:
        return probe_decode(data, max_pixels)
    except ImageProblem as exc:   # a known signature Pillow cannot open: its header is broken
        if exc.reason == Skip.NOT_AN_IMAGE and sniff(data) is not None:
            raise ImageProblem(Skip.BAD_IMAGE_HEADER, f"{sniff(data)} header cannot be read") from None
        raise


def _header_only(data: bytes) -> tuple[str, tuple[int, int]]:
    """(kind, stored size) from the header alone (`--verify none`)."""
    kind = sniff(data)
    size = header_size(kind, data) if kind is not None else None
    if size is None:
        header = _pil_header(data)
        if header is None:
            if kind is None:   # the detail never quotes the bytes: they may be a file the row should not have named
                raise ImageProblem(Skip.NOT_AN_IMAGE, "no image format the loader decodes identifies the bytes")
            raise ImageProblem(Skip.BAD_IMAGE_HEADER, f"{kind} header gives no size")
        kind, size = kind or _KINDS.get(header[0], header[0].lower()), header[1]
    if size[0] <= 0 or size[1] <= 0:
        raise ImageProblem(Skip.BAD_IMAGE_HEADER, f"{kind} header gives size {size[0]}x{size[1]}")
    return kind, size


def verify_decodes(data: bytes, max_pixels: int) -> None:
    """The strictest check (`--verify strict`): ImageProblem unless the image decodes cleanly."""
    check_image(data, max_pixels, "strict")


def _strict_jpeg(data: bytes) -> None:
    """ImageProblem unless TurboJPEG decodes every scan with no warning (nothing to do without simplejpeg)."""
    try:
        import simplejpeg
    except ImportError:
        return
    try:
        _, _, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        space = "CMYK" if colorspace in ("CMYK", "YCCK") else "GRAY" if colorspace == "Gray" else "RGB"
        simplejpeg.decode_jpeg(data, colorspace=space, strict=True)
    except Exception as exc:   # libjpeg errors and warnings ("Corrupt JPEG data: ...") are ValueErrors
        raise ImageProblem(Skip.UNDECODABLE_IMAGE, f"jpg does not decode: {scrub(str(exc))}") from None


class _decoding:
    """Context: any exception from decoding one image becomes an ImageProblem (bombs keep their reason)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None or not issubclass(exc_type, Exception) or issubclass(exc_type, ImageProblem):
            return False
        from PIL import Image

        if issubclass(exc_type, Image.DecompressionBombError):
            raise ImageProblem(Skip.DECOMPRESSION_BOMB, scrub(str(exc))) from None
        raise ImageProblem(Skip.UNDECODABLE_IMAGE, f"{exc_type.__name__}: {scrub(str(exc))}") from None


def prepare_image(data: bytes, opts: ImageOptions) -> EncodedImage:
    """Validate, then keep the original bytes or re-encode as asked."""
    kind, w, h = check_image(data, opts.max_pixels, opts.verify)
    needs_resize = opts.resize_max_side is not None and max(w, h) > opts.resize_max_side
    if not needs_resize and opts.quality is None:
        return EncodedImage(data=data, ext=kind, width=w, height=h)
    if needs_resize:
        scale = opts.resize_max_side / max(w, h)
        target = (max(1, round(w * scale)), max(1, round(h * scale)))
    else:
        target = (w, h)
    out, size = reencode_jpeg(data, target, opts.quality or 95)
    return EncodedImage(data=out, ext="jpg", width=size[0], height=size[1])


def decode_resized(data: bytes, target: tuple[int, int], resample: str = "bicubic"):
    """Decode to an RGB PIL image of exactly `target` (w, h), using JPEG draft mode and reduce.

    `resample` is "bicubic" (memmap images) or "area" (Pillow's BOX filter, the
    equivalent of OpenCV's INTER_AREA that img2dataset uses to downscale).
    Displayed pixels: EXIF orientation is applied (see the module docstring).
    Any decode failure is an ImageProblem (undecodable_image, decompression_bomb).
    """
    with _decoding():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _resized(open_image(data), target, resample)


_TRANSPOSE = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE", 6: "ROTATE_270",
              7: "TRANSVERSE", 8: "ROTATE_90"}


def _resized(im, target: tuple[int, int], resample: str):
    """`im` as displayed (EXIF orientation applied), RGB, resized to `target` (w, h)."""
    from PIL import Image

    orientation = im.getexif().get(EXIF_ORIENTATION, 1) if im.format != "TIFF" else 1   # Pillow turns TIFFs
    method = _TRANSPOSE.get(orientation) if isinstance(orientation, int) else None
    stored = displayed_size(*target, orientation) if method else target   # the target in stored pixels
    if im.format == "JPEG":
        im.draft("RGB", stored)  # DCT-domain downscale by 1/2, 1/4 or 1/8 while staying >= target
    if im.mode != "RGB":
        im = im.convert("RGB")
    if im.size != stored:
        im = im.resize(stored, Image.BOX if resample == "area" else Image.BICUBIC, reducing_gap=2.0)
    if method is not None:
        im = im.transpose(getattr(Image.Transpose, method))
    return im


def reencode_jpeg(data: bytes, target: tuple[int, int], quality: int) -> tuple[bytes, tuple[int, int]]:
    """Downscale to `target` (w, h, displayed) with the area filter and encode as JPEG.

    The pixels are stored as displayed (EXIF orientation applied), so the output carries no
    orientation tag. Any decode failure is an ImageProblem.
    """
    with _decoding():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            im = _resized(open_image(data), target, "area")
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=quality)
    return buf.getvalue(), im.size
