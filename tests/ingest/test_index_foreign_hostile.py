"""`vlmdata index` on hostile tars: each malformed header is one counted corrupt_shard (the samples before it
stay), an oversized member is member_too_large with bounded memory, repeated keys are duplicate_key (never
merged), links and devices are link_member, names that are not UTF-8 are bad_member_name, and a corrupt first
.tar.gz gives an error that says so."""
from __future__ import annotations

import gzip
import io
import tracemalloc
import zlib

import pytest
from PIL import Image

from tests.helpers.tars import end, header, member, pax
from vlmdata.errors import ConfigError
from vlmdata.formats import SampleIndex
from vlmdata.ingest import IndexConfig, index_dataset


def img(color=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (24, 16), color).save(buf, format="JPEG")
    return buf.getvalue()


def sample(key: str, caption: str = "a caption", color=(200, 30, 30)) -> bytes:
    return member(f"{key}.jpg".encode(), img(color)) + member(f"{key}.txt".encode(), caption.encode())


def index(tmp_path, shards: dict[str, bytes], **kw):
    root = tmp_path / "wds"
    root.mkdir()
    for name, data in shards.items():
        (root / name).write_bytes(data)
    return index_dataset(IndexConfig(root=str(root), workers=0, **kw)), root


CUT = {"corrupt_shard": 1, "truncated_sample": 1}   # the sample being read when the header broke is not trusted


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bad, kept, skipped", [
    (pax(b"0 path=x\n"), 3, CUT),
    (pax(b"13 size=abcd\n"), 3, CUT),
    (pax(b"12path=abc\n"), 3, CUT),
    (header(b"k2.jpg", size_field=b"99999999999x"), 3, CUT),
    (header(b"k2.jpg", size_field=b"\x80" + (1 << 62).to_bytes(11, "big")), 4,
     {"corrupt_shard": 1, "member_too_large": 1}),
], ids=["pax-length-0", "pax-size-abcd", "pax-no-space", "non-octal-size", "size-2**62"])
def test_a_malformed_header_costs_the_rest_of_its_shard_only(tmp_path, bad, kept, skipped):
    shard0 = sample("k0") + sample("k1") + bad + sample("k3") + end()
    m, _ = index(tmp_path, {"a.tar": shard0, "b.tar": sample("k5") + sample("k6") + end()})
    assert m.num_samples == kept and m.stats["skipped"] == skipped   # the second shard is whole
    assert m.stats["input_rows"] == kept + sum(v for k, v in skipped.items() if k != "corrupt_shard")


def test_a_huge_member_is_skipped_unread(tmp_path):
    """A small .tar.gz whose .jpg member inflates to 48 MiB (limit 16 MiB): never held in memory."""
    size = 48 << 20
    comp = zlib.compressobj(1, zlib.DEFLATED, 31)  # gzip container
    parts = [comp.compress(sample("k0") + header(b"big.jpg", size))]
    zeros = b"\0" * (1 << 20)
    for _ in range(size >> 20):
        parts.append(comp.compress(zeros))
    parts.append(comp.compress(member(b"big.txt", b"caption") + sample("k2") + end()))
    parts.append(comp.flush())
    data = b"".join(parts)
    assert len(data) < 1 << 20
    tracemalloc.start()
    try:
        m, _ = index(tmp_path, {"a.tar.gz": data}, max_member_bytes=16 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert m.stats["skipped"] == {"member_too_large": 1} and m.num_samples == 2
    assert peak < 16 << 20, peak


def test_repeated_keys_links_and_bad_names_are_counted_never_merged(tmp_path):
    data = (sample("k0", "first caption", (200, 0, 0)) + sample("k0", "second caption", (0, 0, 200))   # twice in a row
            + sample("k1")
            + member(b"k2.jpg", img()) + header(b"k2.txt", 0, b"2", linkname=b"/etc/passwd")           # symlink text
            + header(b"k3.jpg", 0, b"1", linkname=b"k1.jpg") + member(b"k3.txt", b"hard link")           # hard link
            + member(b"\xff.jpg", img()) + member(b"\xff.txt", b"one")                                    # not UTF-8
            + member(b"\xfe.jpg", img()) + member(b"\xfe.txt", b"two")
            + sample("k4") + sample("k1") + end())                                                         # k1 again
    m, root = index(tmp_path, {"a.tar": data})
    assert m.stats["skipped"] == {"duplicate_key": 2, "link_member": 2, "bad_member_name": 2}
    assert m.stats["input_rows"] == 9 and m.num_samples == 3
    ix = SampleIndex.load(str(root / m.shards[0].index))
    assert ix.keys() == ["k0", "k1", "k4"] and list(ix.n_images) == [1, 1, 1]
    tar = (root / "a.tar").read_bytes()
    off = int(ix.tok_offset[0])
    assert tar[off:off + int(ix.tok_size[0])] == b"first caption"      # the first k0 wins, nothing merged


def test_a_corrupt_first_gzip_shard_says_what_is_wrong(tmp_path):
    good = gzip.compress(sample("k0") + end())
    with pytest.raises(ConfigError, match=r"cannot read the first shard a\.tar\.gz: .*corrupt or not a "
                                          r"gzip-compressed tar"):
        index(tmp_path, {"a.tar.gz": b"\x1f\x8b\x08\x00" + b"\x42" * 2000, "b.tar.gz": good})
