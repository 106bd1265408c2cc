"""The image codecs the installed Pillow (Pillow-SIMD) must have, and a loud check for them.

Pillow-SIMD is built from source (tools/setup_env.sh) and links only the codec
libraries whose headers are installed at build time. Built without them,
WebP, most TIFFs and JPEG 2000 images are accepted at shard time and then
fail to decode at load time, and LAB or ICC conversions fail, so the set-up
runs `python -m vlmdata.decode.codec_support`, which exits non-zero naming what is
missing and the Debian packages that provide it.
"""
from __future__ import annotations

import sys

from vlmdata.errors import ConfigError

__all__ = ["REQUIRED_CODECS", "check_codecs", "missing_codecs"]

# PIL.features name -> (what it decodes, the Debian package with its headers)
REQUIRED_CODECS: dict[str, tuple[str, str]] = {
    "jpg": ("JPEG", "libjpeg-dev"),
    "zlib": ("PNG", "zlib1g-dev"),
    "webp": ("WebP", "libwebp-dev"),
    "libtiff": ("TIFF (compressed)", "libtiff-dev"),
    "jpg_2000": ("JPEG 2000", "libopenjp2-7-dev"),
    "littlecms2": ("LAB and ICC colour conversion (LittleCMS)", "liblcms2-dev"),
}


def missing_codecs() -> list[str]:
    """PIL.features names of the required codecs this Pillow build lacks."""
    from PIL import features

    return [name for name in REQUIRED_CODECS if not features.check(name)]


def check_codecs() -> None:
    """ConfigError naming each missing codec and how to get it."""
    missing = missing_codecs()
    if not missing:
        return
    import PIL

    what = ", ".join(f"{REQUIRED_CODECS[m][0]} ({m})" for m in missing)
    debs = " ".join(REQUIRED_CODECS[m][1] for m in missing)
    raise ConfigError(f"Pillow {PIL.__version__} was built without {what}: such images would be dropped at load "
                      f"time. Install the headers (apt-get install -y {debs}) and rebuild Pillow-SIMD "
                      "(tools/setup_env.sh does both), or install stock Pillow (VLMDATA_NO_SIMD=1).")


def main() -> int:
    """`python -m vlmdata.decode.codec_support`: 0 when every required codec is there, else 1 with the reason."""
    try:
        check_codecs()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    import PIL

    print(f"Pillow {PIL.__version__}: codecs {', '.join(REQUIRED_CODECS)} present")
    return 0


if __name__ == "__main__":
    sys.exit(main())
