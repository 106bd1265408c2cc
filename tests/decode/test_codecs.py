"""The PIL build has every codec real-world data needs (WebP, TIFF, JPEG 2000, LittleCMS), and the set-up fails
loudly when one is missing."""
from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
from PIL import Image

from tests.helpers.image_zoo import picture, save
from tests.helpers.paths import REPO
from vlmdata.decode import PillowDecoder, missing_codecs


def test_this_build_decodes_webp_tiff_jpeg2000_and_lab():
    assert missing_codecs() == []
    rgb = Image.fromarray(picture())
    dec = PillowDecoder()
    for data in (save(rgb, "WEBP", lossless=True), save(rgb, "TIFF", compression="tiff_adobe_deflate"),
                 save(rgb, "JPEG2000", irreversible=False), save(rgb.convert("LAB"), "TIFF")):
        out = dec.decode_one(data, 64, 48)
        assert out is not None and np.abs(out.astype(int) - picture().astype(int)).mean() < 3
    assert dec.pop_errors() == {}
    assert Image.open(io.BytesIO(save(rgb, "WEBP"))).format == "WEBP"


def test_a_missing_codec_fails_the_check_with_the_package_to_install():
    code = ("import PIL.features as f, sys; f.check = lambda name: name not in ('webp', 'littlecms2'); "
            "from vlmdata.decode.codec_support import main; sys.exit(main())")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "WebP (webp)" in r.stderr and "libwebp-dev" in r.stderr and "liblcms2-dev" in r.stderr
    ok = subprocess.run([sys.executable, "-m", "vlmdata.decode.codec_support"], cwd=REPO, capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0 and "webp" in ok.stdout


def test_setup_installs_headers_before_the_build_and_checks_after_it():
    script = (REPO / "tools" / "setup_env.sh").read_text()
    headers = script.index("install_codec_headers\n        ")           # called inside the build branch
    build = script.index("--no-binary pillow-simd")
    check = script.rindex("-m vlmdata.decode.codec_support ||")
    assert headers < build < check
    for deb in ("libwebp-dev", "libtiff-dev", "liblcms2-dev", "libopenjp2-7-dev"):
        assert deb in script
    r = subprocess.run(["bash", "-n", str(REPO / "tools" / "setup_env.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
