"""The loader's Pillow formats: Pillow's own plugin order, so a file opens with the plugin a plain `Image.open` picks."""
import io

import numpy as np
import pytest
from PIL import Image

from vlmdata.decode import EXCLUDED_FORMATS, loader_formats, open_image

Image.init()
SAVED = [f for f in ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP", "PPM", "ICO", "TGA", "PCX", "SGI", "IM", "DDS", "QOI")
         if f in Image.SAVE]      # the formats this Pillow writes


def test_formats_follow_pillows_registration_order():
    got = loader_formats()
    assert not set(got) & EXCLUDED_FORMATS
    assert set(got) == set(Image.OPEN) - EXCLUDED_FORMATS
    assert list(got) == [f for f in Image.ID if f in got]          # Image.open's order, not alphabetical


@pytest.mark.parametrize("fmt", SAVED)
def test_a_file_opens_as_a_plain_image_open_opens_it(fmt):
    img = Image.fromarray(np.random.default_rng(3).integers(0, 256, (24, 32, 3), np.uint8))
    buf = io.BytesIO()
    img.save(buf, fmt)
    data = buf.getvalue()
    with Image.open(io.BytesIO(data)) as want, open_image(data) as got:
        assert got.format == want.format and got.size == want.size
