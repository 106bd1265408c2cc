"""Checking index rows against the tar members they point at: no false alarm on names other tools write (long
pax / GNU names, ustar prefixes, non-UTF-8 bytes), and a row pointing at another sample's member is caught."""
from __future__ import annotations

import dataclasses
import io
import tarfile

import numpy as np
import pytest

from vlmdata.errors import BadIndexError, IndexMismatchError
from vlmdata.formats import (
    CountingReader,
    IndexBuilder,
    MemberCheck,
    ShardInfo,
    check_index_file,
    is_utf8_name,
    memmap_bad_rows,
    scan_tar,
)


def foreign_tar(fmt: int, names: list[str], encoding: str = "utf-8") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, encoding=encoding) as tar:
        for i, name in enumerate(names):
            data = f"member {i} {name}".encode() * (i + 1)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def index_of(data: bytes):
    """The index `vlmdata index` would build: key = name up to the first dot of the basename; members whose
    names are not UTF-8 are left out (`vlmdata index` counts them as bad_member_name)."""
    samples: dict[str, dict] = {}
    for entry, _ in scan_tar(CountingReader(io.BytesIO(data))):
        if not is_utf8_name(entry.name):
            continue
        slash = entry.name.rfind("/") + 1
        dot = entry.name.find(".", slash)
        key, ext = entry.name[:dot], entry.name[dot + 1:]
        s = samples.setdefault(key, {"images": []})
        if ext == "txt":
            s["tok"] = (entry.data, entry.size)
        else:
            s["images"].append((entry.data, entry.size, 1, 1))
    b = IndexBuilder()
    for key, s in samples.items():
        b.add(key, offset=0, span=0, tok=s["tok"], meta=(-1, 0), text_tokens=1, images=s["images"])
    return b.build()


LONG = "d" * 60 + "/" + "e" * 70 + "/" + "sample_" + "x" * 90
NAMES = [f"{LONG}.txt", f"{LONG}.jpg", "dir/sub/k1.txt", "dir/sub/k1.0.jpg", "dir/sub/k1.1.png",
         "short.txt", "short.jpg", "k\u00e9y.txt", "k\u00e9y.jpg"]


@pytest.mark.parametrize("fmt,encoding", [(tarfile.PAX_FORMAT, "utf-8"), (tarfile.GNU_FORMAT, "utf-8"),
                                          (tarfile.GNU_FORMAT, "latin-1"), (tarfile.USTAR_FORMAT, "utf-8")])
def test_names_other_tools_write_pass_and_swapped_rows_fail(fmt, encoding):
    names = NAMES if fmt != tarfile.USTAR_FORMAT else [n for n in NAMES if n.split(".")[0] != LONG] + \
        [f"{'p' * 90}/{'q' * 40}.txt", f"{'p' * 90}/{'q' * 40}.jpg"]      # ustar: prefix + name, no long names
    data = foreign_tar(fmt, names, encoding)
    ix = index_of(data)
    check = MemberCheck(ix, own_layout=False)
    for i in range(len(ix)):
        check(data, i)                                       # every row matches its members
    tok = ix.tok_offset.copy()
    tok[[0, 1]] = tok[[1, 0]]
    swapped = MemberCheck(dataclasses.replace(ix, tok_offset=tok), own_layout=False)
    for i in (0, 1):
        with pytest.raises(IndexMismatchError, match="does not describe this shard"):
            swapped(data, i)
    size = ix.img_size.copy()
    size[0] += 1                                             # right member, wrong size
    with pytest.raises(IndexMismatchError, match="bytes, not"):
        MemberCheck(dataclasses.replace(ix, img_size=size), own_layout=False)(data, 0)
    off = ix.img_offset.copy()
    off[0] = len(data) + 512                                 # outside the shard
    with pytest.raises(IndexMismatchError, match="outside"):
        MemberCheck(dataclasses.replace(ix, img_offset=off), own_layout=False)(data, 0)


def test_index_file_must_describe_the_manifests_shard():
    ix = index_of(foreign_tar(tarfile.PAX_FORMAT, NAMES)).describes(1000, 0xABC)
    info = ShardInfo(name="s.tar", index="s.index.npz", samples=len(ix), images=ix.n_image_total, bytes=1000,
                     crc32=0xABC)
    check_index_file(ix, info)
    with pytest.raises(BadIndexError, match="another shard's index"):
        check_index_file(ix, dataclasses.replace(info, crc32=0xABD))
    with pytest.raises(BadIndexError, match="samples"):
        check_index_file(ix, dataclasses.replace(info, samples=len(ix) + 1))
    check_index_file(dataclasses.replace(ix, shard_bytes=None, shard_crc32=None), dataclasses.replace(info, crc32=1))


def test_memmap_rows_are_bounds_checked():
    b = IndexBuilder()
    for i in range(4):
        b.add(f"k{i}", offset=10 * i, span=10, tok=(10 * i, 10), meta=(5 * i, 5), text_tokens=9,
              images=[(i, 100, 8, 8)])
    ix = b.build()
    assert memmap_bad_rows(ix, n_images=4, n_tokens=40, meta_bytes=20) is None
    img = ix.img_offset.copy()
    img[1] = -1
    tok = ix.tok_offset.copy()
    tok[3] = 35                                              # runs past the token array
    bad = memmap_bad_rows(dataclasses.replace(ix, img_offset=img, tok_offset=tok), 4, 40, 20)
    assert bad.tolist() == [False, True, False, True]
    assert memmap_bad_rows(ix, n_images=3, n_tokens=40, meta_bytes=20).tolist() == [False, False, False, True]
    assert isinstance(bad, np.ndarray)
