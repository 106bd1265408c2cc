"""The fast tar writer is byte-identical to tarfile; DALI index format round-trips; CRC file wrapper."""
from __future__ import annotations

import io
import tarfile
import zlib

import pytest

from vlmdata.formats import CrcFile, Member, TarShardWriter, format_index, parse_index, split_name

NAMES = ["a.json", "x" * 99 + "j", "x" * 94 + ".0.jpg", "dir/ü_é.txt", "d" * 60 + "/" + "k" * 70 + ".json",
         "s.tok.npy"]


@pytest.mark.parametrize("mtime", [0, 1_700_000_000])
def test_tar_writer_matches_tarfile_stream(mtime):
    members = [(n, bytes([i]) * (i * 300 + (i % 2) * 511)) for i, n in enumerate(NAMES)]
    ours = io.BytesIO()
    w = TarShardWriter(ours, mtime=mtime)
    locs = [w.add(n, d) for n, d in members]
    w.close()
    ref = io.BytesIO()
    with tarfile.open(fileobj=ref, mode="w|", format=tarfile.USTAR_FORMAT) as t:
        for n, d in members:
            info = tarfile.TarInfo(n)
            info.size, info.mtime, info.mode, info.uname, info.gname = len(d), mtime, 0o444, "", ""
            t.addfile(info, io.BytesIO(d))
    assert ours.getvalue() == ref.getvalue()
    assert w.offset == len(ours.getvalue())
    with tarfile.open(fileobj=io.BytesIO(ours.getvalue())) as t:
        got = [(m.name, m.offset, m.offset_data, m.size) for m in t.getmembers()]
    assert got == [(n, loc.header, loc.data, loc.size) for (n, _), loc in zip(members, locs)]


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
