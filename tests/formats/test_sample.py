"""Samples in tar shards: members and recorded offsets, reading back, foreign caption text, safe keys, the
token member's fast path (equal to np.save / np.load)."""
import io
import json
import tarfile

import numpy as np
import pytest

from tests.helpers.formats import SAMPLES
from tests.helpers.formats import write_shard as _write_shard
from vlmdata.formats import (
    SampleIndex,
    read_sample,
    safe_key,
    text_decoder_for,
    tokens_from_npy,
    tokens_to_npy,
)
from vlmdata.text import ByteTokenizer


def test_written_shard_is_a_plain_tar_with_recorded_offsets():
    data, index = _write_shard(SAMPLES)
    names = tarfile.open(fileobj=io.BytesIO(data)).getnames()
    assert names == ["a.json", "a.tok.npy", "a.0.jpg", "b.json", "b.tok.npy", "c.json", "c.tok.npy", "c.0.jpg", "c.1.jpg"]
    assert index.n_images.tolist() == [1, 0, 2]
    assert index.width.tolist() == [10, 30, 50] and index.height.tolist() == [20, 40, 60]
    assert bytes(data[index.img_offset[2]:index.img_offset[2] + index.img_size[2]]) == b"\xff\xd8three\xff\xd9"
    # the span of each sample covers exactly its members
    assert index.offset[1] == index.offset[0] + index.span[0]


def test_read_sample_round_trip_and_index_bytes():
    data, index = _write_shard(SAMPLES)
    index = SampleIndex.from_bytes(index.to_bytes())
    rec = read_sample(data, index, 2, with_meta=True)
    assert rec.key == "c"
    assert [bytes(b) for b in rec.images] == [b"\xff\xd8two\xff\xd9", b"\xff\xd8three\xff\xd9"]
    assert rec.sizes == [(30, 40), (50, 60)]
    assert rec.meta == {"id": "c", "text": "third"}
    tok = ByteTokenizer()
    assert int((rec.tokens[0] == tok.special.image).sum()) == 2
    assert index.text_tokens[2] == rec.tokens.shape[1] - 2


def test_text_decoder_for_foreign_caption_shards():
    dec = text_decoder_for({"text": "json", "json_field": "caption"}, ByteTokenizer().identity())
    toks = dec(memoryview(json.dumps({"caption": "a dog"}).encode()), 1)
    tok = ByteTokenizer()
    assert int((toks[0] == tok.special.image).sum()) == 1
    assert tok.decode(toks[0][toks[1] == 1]) == "a dog"


def test_safe_key_is_unique_dot_free_and_short():
    assert safe_key("abc_1") == "abc_1"
    k1, k2 = safe_key("a.b/c"), safe_key("a_b_c")
    assert "." not in k1 and "/" not in k1 and k1 != k2
    assert len(safe_key("x" * 500)) <= 80


def test_token_member_fast_path_matches_np_load():
    from vlmdata.formats import tokens_from_npy, tokens_to_npy

    for n in (0, 1, 7, 4096):
        arr = np.arange(2 * n, dtype=np.int32).reshape(2, n)
        data = tokens_to_npy(arr)
        buf = io.BytesIO()
        np.save(buf, arr)
        assert data == buf.getvalue()
        out = tokens_from_npy(memoryview(data))
        assert np.array_equal(out, arr) and out.flags.writeable
    with pytest.raises(ValueError, match="expected int32"):
        tokens_from_npy(tokens_to_npy(np.zeros((3, 2), np.int32)))


def test_tokens_to_npy_is_np_save():
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 1 << 20, (2, t)).astype(np.int32) for t in (*range(0, 130), 999, 1000, 65537)]
    arrays += [np.zeros(5, np.int64), np.ones((2, 9), np.int32)[:, ::2], np.asfortranarray(np.ones((2, 7)))]
    for a in arrays:
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(a, dtype=np.int32), allow_pickle=False)
        got = tokens_to_npy(a)
        assert got == buf.getvalue(), a.shape
        assert len(got) % 64 == (a.size * 4) % 64  # data starts on a 64-byte boundary
        if a.ndim == 2 and a.shape[0] == 2:
            assert np.array_equal(tokens_from_npy(got), a)
