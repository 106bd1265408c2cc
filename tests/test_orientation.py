"""EXIF orientation: read from the bytes as Pillow's getexif does, applied as exif_transpose does, and the
rule that keeps datasets indexed before orientation was applied decoding as they always did."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from tests.helpers.image_zoo import exif_bytes, picture, save, zoo
from vlmdata.orientation import apply_orientation, displayed_size, effective_orientation, read_orientation

TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
             5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
             8: Image.Transpose.ROTATE_90}


@pytest.mark.parametrize("name", sorted(zoo()))
def test_read_orientation_agrees_with_pillow(name):
    data = zoo()[name]
    with Image.open(io.BytesIO(data)) as im:
        want = im.getexif().get(0x0112, 1)
    assert read_orientation(data) == want


def test_orientation_in_every_container():
    rgb = Image.fromarray(picture())
    assert read_orientation(save(rgb, "JPEG", exif=exif_bytes(7))) == 7
    assert read_orientation(save(rgb, "PNG", exif=exif_bytes(5))) == 5
    assert read_orientation(save(rgb, "WEBP", exif=exif_bytes(8), lossless=True)) == 8
    assert read_orientation(save(rgb, "JPEG")) == 1
    assert read_orientation(b"\xff\xd8\xff\xe1\x00\x08Exif\x00\x00garbage") == 1   # a broken EXIF block is "as stored"
    assert read_orientation(b"not an image") == 1


@pytest.mark.parametrize("name", sorted(zoo()))
def test_any_buffer_reads_as_bytes(name):
    """Decoders hand over numpy arrays and memoryviews: segment lengths over 255 must not wrap in uint8."""
    data = zoo()[name]
    want = read_orientation(data)
    assert read_orientation(np.frombuffer(data, np.uint8)) == want
    assert read_orientation(memoryview(data)) == want
    assert read_orientation(bytearray(data)) == want


def test_long_segment_before_exif_in_a_numpy_buffer():
    rgb = Image.fromarray(picture())
    data = save(rgb, "JPEG", exif=exif_bytes(6))
    comment = b"\xff\xfe" + (2 + 600).to_bytes(2, "big") + b"c" * 600         # a 602-byte COM segment first
    data = data[:2] + comment + data[2:]
    assert read_orientation(np.frombuffer(data, np.uint8)) == 6


@pytest.mark.parametrize("orientation", range(1, 9))
def test_apply_orientation_is_pillows_transpose(orientation):
    arr = picture()
    want = np.asarray(Image.fromarray(arr).transpose(TRANSPOSE[orientation])) if orientation > 1 else arr
    got = apply_orientation(arr, orientation)
    np.testing.assert_array_equal(got, want)
    assert got.flags.c_contiguous
    assert displayed_size(64, 48, orientation) == (want.shape[1], want.shape[0])


def test_effective_orientation_keeps_old_indexes_as_stored():
    stored = (64, 48)
    assert effective_orientation(6, stored, (48, 64)) == 6     # index holds the displayed size: turn
    assert effective_orientation(6, stored, (64, 48)) == 1     # index holds the stored size (older dataset)
    assert effective_orientation(6, stored, (32, 32)) == 6     # a square target: no shape to contradict
    assert effective_orientation(3, stored, (64, 48)) == 3     # flips and 180 degrees never change the shape
    assert effective_orientation(0, stored, (64, 48)) == 1 and effective_orientation(9, stored, (64, 48)) == 1
