"""The fast tar writer is byte-identical to tarfile's stream, with the member locations it reports."""
from __future__ import annotations

import io
import tarfile

import pytest

from vlmdata.formats import TarShardWriter

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
