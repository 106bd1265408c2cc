import io
import json
import tarfile
import zlib

import numpy as np
import pytest

from vlmdata.cache import DirectFetcher, RetryPolicy, ShardRef
from vlmdata.errors import CorruptShardError, FetchError
from vlmdata.formats import (
    EncodedImage,
    IndexBuilder,
    Manifest,
    SampleIndex,
    ShardInfo,
    TarShardWriter,
    concat_planning_columns,
    read_sample,
    safe_key,
    text_decoder_for,
    write_sample,
)
from vlmdata.text import ByteTokenizer, encode_conversation


def _write_shard(samples):
    tok = ByteTokenizer()
    buf = io.BytesIO()
    writer, builder = TarShardWriter(buf, mtime=0), IndexBuilder()
    for key, text, images in samples:
        tokens = encode_conversation(tok, [("user", ""), ("assistant", text)], len(images))
        imgs = [EncodedImage(data, "jpg", w, h) for data, w, h in images]
        write_sample(writer, builder, key, {"id": key, "text": text}, tokens, imgs, tok.special.image)
    writer.close()
    return buf.getvalue(), builder.build()


SAMPLES = [("a", "first", [(b"\xff\xd8one\xff\xd9", 10, 20)]),
           ("b", "second one", []),
           ("c", "third", [(b"\xff\xd8two\xff\xd9", 30, 40), (b"\xff\xd8three\xff\xd9", 50, 60)])]


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


def test_index_validation_catches_inconsistency():
    _, index = _write_shard(SAMPLES)
    index.image_start = index.image_start + 1
    with pytest.raises(ValueError, match="image_start"):
        index.validate()


def test_planning_columns_merge_shards():
    _, a = _write_shard(SAMPLES)
    _, b = _write_shard(SAMPLES[:1])
    cols = concat_planning_columns([a, b])
    assert cols["shard"].tolist() == [0, 0, 0, 1]
    assert cols["local"].tolist() == [0, 1, 2, 0]
    assert cols["image_start"].tolist() == [0, 1, 1, 3]
    assert cols["width"].tolist() == [10, 30, 50, 10]


def test_safe_key_is_unique_dot_free_and_short():
    assert safe_key("abc_1") == "abc_1"
    k1, k2 = safe_key("a.b/c"), safe_key("a_b_c")
    assert "." not in k1 and "/" not in k1 and k1 != k2
    assert len(safe_key("x" * 500)) <= 80


def test_manifest_round_trip_and_errors(tmp_path):
    m = Manifest(kind="webdataset", shards=[ShardInfo("s.tar", "s.index.npz", 3, 3, 100, 7)],
                 tokenizer=ByteTokenizer().identity())
    m.save(str(tmp_path))
    back = Manifest.load(str(tmp_path))
    assert back == m and back.num_samples == 3
    with pytest.raises(FileNotFoundError, match="vlmdata shard"):
        Manifest.load(str(tmp_path / "nowhere"))
    raw = json.loads(m.to_json())
    raw["version"] = 99
    with pytest.raises(ValueError, match="upgrade"):
        Manifest.from_json(json.dumps(raw))


def test_direct_fetcher_verifies_and_reports(tmp_path):
    p = tmp_path / "x.bin"
    payload = np.arange(1000, dtype=np.int32).tobytes()
    p.write_bytes(payload)
    crc = zlib.crc32(payload)
    f = DirectFetcher(retry=RetryPolicy(attempts=2, base_delay=0.0, seed=0))
    assert f.get(ShardRef(str(p), len(payload), crc)) == payload
    with pytest.raises(CorruptShardError):
        f.get(ShardRef(str(p), len(payload), crc ^ 1))
    with pytest.raises(FetchError, match="not found"):
        f.get(ShardRef(str(tmp_path / "missing.bin")))


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
