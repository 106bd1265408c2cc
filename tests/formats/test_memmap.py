"""`--format memmap`: pre-resized images and tokens round-trip through MemmapShard and plain np.memmap."""
from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from PIL import Image

from tests.helpers.shards import expected_tokens, read_jsonl, shard
from vlmdata.formats import MAGIC, TRAILER, MemmapShard, SampleIndex
from vlmdata.ingest import decode_resized

S = 48


@pytest.fixture(scope="module")
def memmap_ds(small_llava_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("mm")
    subset = small_llava_corpus / "subset.jsonl"
    subset.write_text("\n".join(json.dumps(r) for r in read_jsonl(small_llava_corpus / "data.jsonl")[:40]))
    m = shard(subset, out, format="memmap", image_size=S, max_samples_per_shard=25)
    return small_llava_corpus, out, m


def test_memmap_round_trip(memmap_ds):
    corpus, out, m = memmap_ds
    records = {r["id"]: r for r in read_jsonl(corpus / "data.jsonl")}
    assert m.kind == "memmap" and m.image_policy == {"kind": "fixed", "size": S, "patch": 16, "merge": 1}
    assert m.num_samples == 40 and len(m.shards) == 2
    seen = 0
    for info in m.shards:
        data = (out / info.name).read_bytes()
        assert info.bytes == len(data) and info.crc32 == zlib.crc32(data) & 0xFFFFFFFF
        shard_ = MemmapShard(str(out), info)
        assert isinstance(shard_.images, np.memmap) or isinstance(shard_.images.base, np.memmap)
        for i in range(len(shard_)):
            rec = shard_.read_sample(i, with_meta=True)
            src = records[rec.key]
            np.testing.assert_array_equal(rec.tokens, expected_tokens(src))
            assert rec.meta["id"] == src["id"]
            assert len(rec.images) == len(src["images"])
            for im, rel, size in zip(rec.images, src["images"], rec.sizes):
                assert im.shape == (S, S, 3) and im.dtype == np.uint8
                raw = (corpus / rel).read_bytes()
                np.testing.assert_array_equal(im, np.asarray(decode_resized(raw, (S, S))))
                ref = np.asarray(Image.open(corpus / rel).convert("RGB").resize((S, S), Image.BICUBIC), np.int16)
                assert np.abs(ref - im).mean() < 12  # same picture (draft-mode decode differs slightly)
                assert size == Image.open(corpus / rel).size
            seen += 1
    assert seen == 40


def test_memmap_inspect(memmap_ds):
    from vlmdata.ingest import inspect_dataset

    corpus, out, m = memmap_ds
    text = inspect_dataset(str(out), samples=2)
    assert "kind memmap" in text and "samples 40," in text and text.count("[assistant]") == 2


def test_memmap_loads_with_plain_numpy(memmap_ds):
    corpus, out, m = memmap_ds
    info = m.shards[0]
    path = out / info.name
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    magic, n = TRAILER.unpack(bytes(raw[-TRAILER.size:]))
    assert magic == MAGIC
    footer = json.loads(bytes(raw[-TRAILER.size - n:-TRAILER.size]))
    imgs = np.memmap(path, dtype=np.uint8, mode="r", offset=footer["offsets"]["images"],
                     shape=(footer["n_images"], S, S, 3))
    ids = np.memmap(path, dtype=np.int32, mode="r", offset=footer["offsets"]["ids"], shape=(footer["n_tokens"],))
    index = SampleIndex.load(str(out / info.index))
    via_class = MemmapShard.from_buffer(path.read_bytes(), index)
    for i in range(len(index)):
        rec = via_class.read_sample(i)
        start, count = int(index.tok_offset[i]), int(index.tok_size[i])
        np.testing.assert_array_equal(ids[start:start + count], rec.tokens[0])
        for row, im in zip(index.img_offset[index.image_slice(i)], rec.images):
            np.testing.assert_array_equal(imgs[int(row)], im)
