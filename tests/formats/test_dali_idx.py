"""DALI's index format round-trips; the CRC-counting file wrapper the shard writer uses."""
from __future__ import annotations

import io
import zlib

import pytest

from vlmdata.formats import CrcFile, Member, format_index, parse_index, split_name


def test_crc_file_and_dali_index_round_trip():
    buf = io.BytesIO()
    f = CrcFile(buf)
    f.write(b"hello ")
    f.write(memoryview(b"world"))
    assert f.size == 11 and f.crc == zlib.crc32(b"hello world")
    samples = [[Member("k1.json", 512, 10), Member("k1.0.jpg", 1536, 2000)], [Member("d/k2.tok.npy", 5120, 7)]]
    text = format_index(samples)
    assert text.decode().splitlines() == ["v1.2 2", "json 512 10 k1.json 0.jpg 1536 2000 k1.0.jpg",
                                          "tok.npy 5120 7 d/k2.tok.npy"]
    assert parse_index(text) == samples
    assert split_name("a.b/c.d.e") == ("a.b/c", "d.e")
    with pytest.raises(ValueError, match="whitespace"):
        format_index([[Member("a b.jpg", 512, 1)]])
