"""The tar scanner reports what tarfile reads: names (long and non-ASCII), data offsets, sizes."""
from __future__ import annotations

import io

from vlmdata.formats import CountingReader, scan_tar


def test_scan_tar_matches_tarfile(tmp_path):
    import tarfile

    p = tmp_path / "x.tar"
    with tarfile.open(p, "w", format=tarfile.PAX_FORMAT) as t:
        for name, size in [("a" * 120 + ".txt", 5), ("dir/ü.json", 700), ("short.jpg", 0)]:
            info = tarfile.TarInfo(name)
            info.size = size
            t.addfile(info, io.BytesIO(b"z" * size))
    with open(p, "rb") as f:
        got = [(e.name, e.data, e.size) for e, _ in scan_tar(CountingReader(f))]
    with tarfile.open(p) as t:
        want = [(m.name, m.offset_data, m.size) for m in t.getmembers()]
    assert got == want
