"""Key and location encoding: plain keys unchanged, too long / NUL / marker keys digested, locations sort."""
import numpy as np

from vlmdata.keyindex import MAX_KEY_BYTES, decode_location, encode_key, encode_keys, encode_locations


def test_keys_and_arrays_of_keys_encode_the_same():
    keys = ["s0000001", "a" * (MAX_KEY_BYTES + 1), "\x1fsneaky", "ünïcode", "x" * MAX_KEY_BYTES]
    enc = [encode_key(k) for k in keys]
    assert enc[0] == b"s0000001" and enc[3] == "ünïcode".encode() and enc[4] == b"x" * MAX_KEY_BYTES
    assert enc[1].startswith(b"\x1f") and len(enc[1]) == 65 and enc[2] != b"\x1fsneaky"
    assert len(set(enc)) == len(enc)
    arr = np.asarray([k.encode() for k in keys], dtype="S")
    assert encode_keys(arr).tolist() == enc
    plain = np.asarray([b"a", b"bb"], dtype="S")
    assert encode_keys(plain) is plain                 # nothing to change: no copy


def test_locations_round_trip_and_sort_by_shard_then_row():
    vals = encode_locations(np.array([3, 3, 0, 70000]), np.array([9, 1, 5, 2]))
    as_bytes = vals.tolist()
    assert [decode_location(v) for v in as_bytes] == [(3, 9), (3, 1), (0, 5), (70000, 2)]
    assert sorted(as_bytes) == [as_bytes[i] for i in (2, 1, 0, 3)]
