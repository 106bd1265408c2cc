"""The tar scanner reports what tarfile reads: names (long and non-ASCII), data offsets, sizes; malformed headers
are TarFormatErrors (never a loop, a ValueError or a huge allocation); links and devices carry no data."""
from __future__ import annotations

import io

import pytest

from tests.helpers.tars import end, header, member, pax
from vlmdata.errors import TarFormatError
from vlmdata.formats import CountingReader, is_utf8_name, scan_tar


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


def _scan(data: bytes, specials: bool = False) -> list:
    return [(e.name, e.size, e.kind) for e, _ in scan_tar(CountingReader(io.BytesIO(data)), specials=specials)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", [
    pax(b"0 path=x\n"),                                     # a record of length 0: looped forever
    pax(b"abcd"),                                           # no length, no space
    pax(b"12path=abc\n"),                                   # a record without a space
    pax(b"13 size=abcd\n"),                                 # a pax size that is not a number
    pax(b"99 path=x\n"),                                    # a length past the header's data
    header(b"a.jpg", size_field=b"12x4567\0\0\0\0\0"),      # a size field that is not octal
    header(b"a.jpg", size_field=b"\x80" + (1 << 62).to_bytes(11, "big")),   # 2**62 bytes declared
    header(b"a.jpg", size_field=b"\xff" * 12),              # a negative base-256 size
])
def test_malformed_headers_are_tar_format_errors(bad):
    data = member(b"ok.txt", b"fine") + bad + member(b"b.jpg", b"x") + end()
    got = []
    with pytest.raises(TarFormatError):
        for e, _ in scan_tar(CountingReader(io.BytesIO(data))):
            got.append(e.name)
    assert got[:1] == ["ok.txt"]


def test_a_huge_read_costs_what_the_stream_holds():
    reader = CountingReader(io.BytesIO(b"z" * 1000))
    assert reader.read(1 << 62) == b"z" * 1000 and reader.pos == 1000


def test_links_and_devices_are_reported_and_carry_no_data():
    data = (member(b"a.jpg", b"j" * 10) + header(b"a.txt", 5, b"2", linkname=b"/etc/passwd")
            + header(b"b.jpg", 0, b"1", linkname=b"a.jpg") + header(b"c.jpg", 0, b"3") + header(b"dir/", 0, b"5")
            + member(b"d.txt", b"text") + end())
    assert _scan(data) == [("a.jpg", 10, "file"), ("d.txt", 4, "file")]
    assert _scan(data, specials=True) == [("a.jpg", 10, "file"), ("a.txt", 0, "link"), ("b.jpg", 0, "link"),
                                          ("c.jpg", 0, "special"), ("d.txt", 4, "file")]


def test_names_that_are_not_utf8_stay_distinct():
    data = member(b"\xff.jpg", b"1") + member(b"\xfe.jpg", b"2") + end()
    names = [n for n, _, _ in _scan(data)]
    assert names[0] != names[1] and not any(is_utf8_name(n) for n in names) and is_utf8_name("ü.jpg")
