"""A stored frame list decodes only its sampled members, as Pillow decodes the files; a damaged or cut-short
archive, or one with fewer members than its metadata says, is an undecodable video, never wrong frames."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from vlmdata.errors import Skip
from vlmdata.video import ClipProblem, decode_frame_list, frame_list_info, pack_frames


def _files(count: int) -> tuple[list[bytes], list[str]]:
    """PNG and JPEG files of different sizes in bytes (so member offsets are not multiples of one size)."""
    rng = np.random.default_rng(0)
    files, exts = [], []
    for i in range(count):
        pixels = rng.integers(0, 256, (24 + i, 40, 3), dtype=np.uint8)[:24]
        buf = io.BytesIO()
        fmt, ext = ("PNG", "png") if i % 2 else ("JPEG", "jpg")
        Image.fromarray(pixels).save(buf, format=fmt)
        files.append(buf.getvalue())
        exts.append(ext)
    return files, exts


def test_sampled_members_equal_pillow_on_the_files():
    files, exts = _files(9)
    data = pack_frames(files, exts)
    info = frame_list_info(len(files), 40, 24, 3.0)
    indices = [8, 0, 3, 3, 5]
    got = decode_frame_list(memoryview(data), info, indices)
    for i, frame in zip(indices, got):
        with Image.open(io.BytesIO(files[i])) as img:
            assert np.array_equal(frame, np.asarray(img.convert("RGB")))


@pytest.mark.parametrize("damage", ["header", "cut", "count"])
def test_a_damaged_archive_is_an_undecodable_video(damage):
    files, exts = _files(4)
    data = bytearray(pack_frames(files, exts))
    frames = len(files)
    second_header = 512 + -(-len(files[0]) // 512) * 512
    if damage == "header":
        data[second_header + 10] ^= 0x01                  # a byte of the second member's name
    elif damage == "cut":
        data = data[:second_header + 600]                 # the second member's bytes cut short
    else:
        frames += 1                                       # the metadata says one frame more
    with pytest.raises(ClipProblem) as raised:
        decode_frame_list(bytes(data), frame_list_info(frames, 40, 24, 3.0), [0, 1])
    assert raised.value.reason == Skip.UNDECODABLE_VIDEO
