"""Local shards are mapped, not read, and their CRC32 is checked once per file in the process tree."""
from __future__ import annotations

import binascii
import mmap
import multiprocessing as mp
import zlib

import pytest

from vlmdata.cache import VERIFIED, DirectFetcher, RetryPolicy, ShardRef, local_shards
from vlmdata.errors import CorruptShardError

CALLS: list[int] = []          # sizes passed to zlib.crc32 while the fixture is active


@pytest.fixture
def crc_calls(monkeypatch):
    real = zlib.crc32

    def counting(data, *a):
        CALLS.append(len(data))
        return real(data, *a)

    CALLS.clear()
    monkeypatch.setattr(local_shards.zlib, "crc32", counting)
    VERIFIED.clear()
    return CALLS


CRC = zlib.crc32(b"x" * 100_000) & 0xFFFFFFFF


def _shard(tmp_path, payload=b"x" * 100_000):
    p = tmp_path / "shard-000000-00.tar"
    p.write_bytes(payload)
    return p, ShardRef(str(p), len(payload), CRC)


def _open_in_child(ref, out) -> None:
    before = len(CALLS)
    kind = type(DirectFetcher().get(ref)).__name__
    out.put((kind, len(CALLS) - before))


def test_mapped_and_checked_once(tmp_path, crc_calls):
    p, ref = _shard(tmp_path)
    f = DirectFetcher(retry=RetryPolicy(attempts=1))
    first = f.get(ref)
    assert isinstance(first, mmap.mmap) and bytes(first[:3]) == b"xxx"
    assert crc_calls == [100_000]
    for _ in range(3):
        assert len(f.get(ref)) == 100_000
    assert crc_calls == [100_000]                                   # later opens check the size only


def test_a_forked_worker_trusts_what_the_parent_checked(tmp_path, crc_calls):
    _, ref = _shard(tmp_path)
    DirectFetcher().get(ref)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_open_in_child, args=(ref, q))
    proc.start()
    kind, child_checks = q.get(timeout=30)
    proc.join(30)
    assert kind == "MappedShard" and child_checks == 0 and crc_calls == [100_000]   # checked once, by the parent


def test_changed_file_is_checked_again_and_corruption_reported(tmp_path, crc_calls):
    p, ref = _shard(tmp_path)
    f = DirectFetcher(retry=RetryPolicy(attempts=1))
    f.get(ref)
    p.write_bytes(b"y" + b"x" * 99_999)                             # same size, other bytes
    with pytest.raises(CorruptShardError, match="crc32"):
        f.get(ref)
    assert len(crc_calls) == 2
    p.write_bytes(b"x" * 10)
    with pytest.raises(CorruptShardError, match="10 bytes, expected 100000"):
        f.get(ref)                                                  # torn: size checked at every open


def _mapped_rss_kb(path) -> int:
    """Resident kB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                inside = line.rstrip().endswith(str(path))
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


def test_the_check_reads_the_file_so_no_page_of_the_map_stays_resident(tmp_path, crc_calls):
    """A window of shards checked at once would otherwise count whole in each worker's memory (PSS)."""
    payload = bytes(range(256)) * 16384                              # 4 MiB
    p = tmp_path / "shard-000000-00.mm"
    p.write_bytes(payload)
    data = DirectFetcher(retry=RetryPolicy(attempts=1)).get(ShardRef(str(p), len(payload), binascii.crc32(payload)))
    assert crc_calls == [1 << 20] * 4                                # the whole file, a chunk at a time
    assert _mapped_rss_kb(p) == 0
    assert bytes(data[:1 << 16]) == payload[:1 << 16]                # reading the map does make pages resident
    assert _mapped_rss_kb(p) > 0
