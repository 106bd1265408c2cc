"""Real-world image variants generated in memory: EXIF orientations, CMYK/YCCK JPEG, 16-bit PNG, palettes with
transparency, animations, grey, ICC profiles, WebP, TIFF, JPEG 2000, BMP.

Every image is 64 x 48 stored (sides multiples of 16, so a patch-16 dynamic policy decodes it at its own size)
and shows a gradient with a distinct corner, so a wrong orientation or colour conversion cannot go unnoticed.
"""
from __future__ import annotations

import functools
import io
import struct
import zlib

import numpy as np
from PIL import Image

W, H = 64, 48


def picture(w: int = W, h: int = H) -> np.ndarray:
    """A gradient with a bright top-left block: every flip and rotation looks different."""
    y, x = np.mgrid[0:h, 0:w]
    arr = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x + 2 * y) % 256], -1).astype(np.uint8)
    arr[:8, :12] = (250, 250, 40)
    return arr


def save(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def exif_bytes(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def png16(arr: np.ndarray) -> bytes:
    """A 16-bit PNG (greyscale for 2-D, RGB for (H, W, 3) arrays) of uint16 values, written by hand."""
    color = 0 if arr.ndim == 2 else 2
    h, w = arr.shape[:2]
    raw = b"".join(b"\x00" + arr[i].astype(">u2").tobytes() for i in range(h))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", w, h, 16, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def _ycck_jpeg(rgb: Image.Image) -> bytes:
    import simplejpeg

    cmyk = np.ascontiguousarray(np.asarray(rgb.convert("CMYK")))
    data = simplejpeg.encode_jpeg(cmyk, quality=95, colorspace="CMYK")   # TurboJPEG writes CMYK input as YCCK
    assert simplejpeg.decode_jpeg_header(data)[2] == "YCCK"
    return data


@functools.lru_cache(maxsize=1)
def zoo() -> dict[str, bytes]:
    """name -> encoded bytes of every variant (see the module docstring); do not modify the dict."""
    from PIL import ImageCms

    rgb = Image.fromarray(picture())
    pal = rgb.quantize(colors=32)
    out: dict[str, bytes] = {"jpeg": save(rgb, "JPEG", quality=95)}
    for o in range(2, 9):
        out[f"jpeg_exif_{o}"] = save(rgb, "JPEG", quality=95, exif=exif_bytes(o))
    out["jpeg_xmp_6"] = save(rgb, "JPEG", quality=95,
                             xmp=b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF><rdf:Description '
                                 b'tiff:Orientation="6"/></rdf:RDF></x:xmpmeta>')
    out["png_exif_6"] = save(rgb, "PNG", exif=exif_bytes(6))
    out["webp_exif_8"] = save(rgb, "WEBP", lossless=True, exif=exif_bytes(8))
    out["tiff_exif_3"] = save(rgb, "TIFF", exif=exif_bytes(3))
    out["tiff_exif_6"] = save(rgb, "TIFF", exif=exif_bytes(6))
    out["cmyk_jpeg"] = save(rgb.convert("CMYK"), "JPEG", quality=95)
    out["ycck_jpeg"] = _ycck_jpeg(rgb)
    grey16 = picture()[..., 0].astype(np.uint16) * 3        # values up to 765: Pillow's convert clips at 255
    out["png16_grey"] = png16(grey16)
    out["png16_rgb"] = png16(picture().astype(np.uint16) * 257)
    out["palette_png_trns"] = save(pal, "PNG", transparency=0)
    out["palette_gif_trns"] = save(pal, "GIF", transparency=0)
    frames = [rgb, Image.fromarray(255 - picture())]
    out["animated_gif"] = save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50)
    out["animated_webp"] = save(frames[0], "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    out["grey_jpeg"] = save(rgb.convert("L"), "JPEG", quality=95)
    out["grey_png"] = save(rgb.convert("L"), "PNG")
    out["rgba_png"] = save(rgb.convert("RGBA"), "PNG")
    lab_icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("LAB")).tobytes()   # not sRGB: ignored by convert
    out["icc_jpeg"] = save(rgb, "JPEG", quality=95, icc_profile=lab_icc)
    out["icc_png"] = save(rgb, "PNG", icc_profile=lab_icc)
    out["webp_lossy"] = save(rgb, "WEBP", quality=90)
    out["webp_lossless"] = save(rgb, "WEBP", lossless=True)
    out["tiff_lzw"] = save(rgb, "TIFF", compression="tiff_lzw")
    out["lab_tiff"] = save(rgb.convert("LAB"), "TIFF")
    out["jpeg2000"] = save(rgb, "JPEG2000")
    out["bmp"] = save(rgb, "BMP")
    out["bmp_palette"] = save(pal, "BMP")
    return out


def reference(data: bytes) -> np.ndarray:
    """What every decoder must return: stock Pillow's `ImageOps.exif_transpose(img).convert("RGB")`."""
    from PIL import ImageOps

    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(ImageOps.exif_transpose(img).convert("RGB"))
