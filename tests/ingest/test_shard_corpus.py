"""`vlmdata shard` on a gen_raw corpus with corrupt entries: read back with webdataset and DALI."""
from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from tests.helpers.shards import GEN_RAW_REASONS, expected_tokens, load_npy, read_jsonl, shard, wds_samples
from vlmdata.formats import SampleIndex, parse_index, read_sample
from vlmdata.ingest import inspect_dataset


@pytest.fixture(scope="module")
def sharded(corrupt_llava_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    manifest = shard(corrupt_llava_corpus / "data.jsonl", out, workers=2, max_samples_per_shard=40)
    return corrupt_llava_corpus, out, manifest


def test_good_samples_byte_identical_through_webdataset(sharded):
    corpus, out, manifest = sharded
    records = read_jsonl(corpus / "data.jsonl")
    corrupt = json.loads((corpus / "corrupt.json").read_text())
    assert corrupt, "the corpus must contain corrupt samples"
    got = wds_samples(out)
    good = [r for r in records if r["id"] not in corrupt]
    assert sorted(got) == sorted(r["id"] for r in good)
    for rec in good:
        s = got[rec["id"]]
        for j, rel in enumerate(rec["images"]):
            assert s[f"{j}.jpg"] == (corpus / rel).read_bytes(), f"{rec['id']} image {j} differs"
        assert not any(k.endswith(".jpg") and int(k.split(".")[0]) >= len(rec["images"]) for k in s if k[0].isdigit())
        np.testing.assert_array_equal(load_npy(s["tok.npy"]), expected_tokens(rec))
        meta = json.loads(s["json"])
        assert meta["id"] == rec["id"] and meta["conversations"] == rec["conversations"]


def test_skipped_counts_match_corruption(sharded):
    corpus, out, manifest = sharded
    corrupt = json.loads((corpus / "corrupt.json").read_text())
    expected: dict[str, int] = {}
    for kind in corrupt.values():
        expected[GEN_RAW_REASONS[kind]] = expected.get(GEN_RAW_REASONS[kind], 0) + 1
    st = manifest.stats
    assert st["skipped"] == expected
    assert st["input_rows"] == 150 == st["samples"] + st["skipped_total"]
    for reason, ex in st["examples"].items():
        assert GEN_RAW_REASONS[corrupt[ex["id"]]] == reason
    jobs = [json.loads((out / "_jobs" / f"job-{j:06d}.json").read_text()) for j in range(4)]
    assert [j["rows"] for j in jobs] == [40, 40, 40, 30]
    assert all(j["rows"] == j["written"] + sum(j["skipped"].values()) for j in jobs)


def test_index_matches_tar_and_header_sizes(sharded):
    corpus, out, manifest = sharded
    from PIL import Image

    records = {r["id"]: r for r in read_jsonl(corpus / "data.jsonl")}
    assert manifest.kind == "webdataset" and manifest.tokenizer["name"] == "vlmdata-bytes-v1"
    for info in manifest.shards:
        data = (out / info.name).read_bytes()
        assert len(data) == info.bytes and zlib.crc32(data) & 0xFFFFFFFF == info.crc32
        index = SampleIndex.load(str(out / info.index))
        assert len(index) == info.samples and index.n_image_total == info.images
        for i in range(len(index)):
            rec = read_sample(data, index, i, with_meta=True)
            src = records[rec.key]
            assert [bytes(b) for b in rec.images] == [(corpus / p).read_bytes() for p in src["images"]]
            assert rec.sizes == [Image.open(corpus / p).size for p in src["images"]]
            assert int(index.text_tokens[i]) == rec.tokens.shape[1] - len(src["images"])
            assert rec.meta["id"] == src["id"]
    planning = np.load(out / "planning.npz")
    assert len(planning["text_tokens"]) == manifest.num_samples
    assert int(planning["n_images"].sum()) == manifest.num_images


def test_dali_reader_reads_every_sample_via_idx(sharded):
    corpus, out, manifest = sharded
    from nvidia.dali import fn, pipeline_def

    tars = [str(out / s.name) for s in manifest.shards]
    idxs = [str(out / s.dali_index) for s in manifest.shards]
    for t, ix in zip(tars, idxs):
        with open(t, "rb") as f:
            data = f.read()
        for members in parse_index(open(ix, "rb").read()):
            for m in members:
                assert data[m.offset - 512:m.offset - 512 + len(m.name)] == m.name.encode()
    n = manifest.num_samples
    batch = 8

    @pipeline_def(batch_size=batch, num_threads=1, device_id=None)
    def pipe():
        meta, tok, img = fn.readers.webdataset(paths=tars, index_paths=idxs, ext=["json", "tok.npy", "0.jpg"],
                                               missing_component_behavior="empty", random_shuffle=False,
                                               name="reader")
        return meta, tok, img

    p = pipe()
    p.build()
    assert p.epoch_size("reader") == n
    got = {}
    while len(got) < n:
        metas, toks, imgs = p.run()
        for i in range(len(metas)):
            meta = json.loads(np.array(metas.at(i)).tobytes())
            got.setdefault(meta["id"], (np.array(toks.at(i)).tobytes(), np.array(imgs.at(i)).tobytes()))
    wds = wds_samples(out)
    assert sorted(got) == sorted(wds)
    for key, (tok, img) in got.items():
        assert tok == wds[key]["tok.npy"]
        assert img == wds[key].get("0.jpg", b"")


def test_inspect_reports_counts_and_reasons(sharded):
    corpus, out, manifest = sharded
    text = inspect_dataset(str(out), samples=2)
    assert f"samples {manifest.num_samples}, images {manifest.num_images}" in text
    for reason, count in manifest.stats["skipped"].items():
        assert f"{reason:<20} {count:>8}" in text
    assert text.count("[assistant]") == 2 and "<image " in text
