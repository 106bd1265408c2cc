"""vlmdata retokenize: a second model's view beside the shards, equal to sharding with that model, reading no
image bytes; loading either view; mixing datasets with different tokenizers is a clear error."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.models import samples_of, write_reference_rows
from vlmdata import ShardConfig, VLMDataset, shard_dataset
from vlmdata.cli import main
from vlmdata.errors import ConfigError
from vlmdata.formats import Manifest, SampleIndex
from vlmdata.ingest import RetokenizeConfig, retokenize_dataset
from vlmdata.ingest import retokenize as retok_module
from vlmdata.testing import chatml_folder, llava_folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return chatml_folder(root / "qwen-small"), llava_folder(root / "llava-small")


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return write_reference_rows(tmp_path_factory.mktemp("raw"))[0]


def _all_samples(ds) -> dict:
    got = {}
    for batch in ds:
        got.update(samples_of(batch))
    return got


def test_retokenized_view_equals_sharding_with_that_model_and_reads_no_image_bytes(folders, rows, tmp_path,
                                                                                     monkeypatch):
    qwen, llava = folders
    shard_dataset(ShardConfig(inputs=[str(rows)], output=str(tmp_path / "a"), tokenizer=str(qwen), workers=0,
                              max_samples_per_shard=3))
    shard_dataset(ShardConfig(inputs=[str(rows)], output=str(tmp_path / "b"), tokenizer=str(llava), workers=0,
                              max_samples_per_shard=3))
    tars = {p.name: p.read_bytes() for p in (tmp_path / "a").glob("*.tar")}
    seen: list = []
    real = retok_module.RangeReader.read

    def spy(self, starts, ends):
        seen.append((self.url, list(zip(starts, ends))))
        return real(self, starts, ends)

    monkeypatch.setattr(retok_module.RangeReader, "read", spy)
    result = retokenize_dataset(RetokenizeConfig(dataset=str(tmp_path / "a"), tokenizer=str(llava), view="llava", workers=0))
    assert result.encoded == result.samples == 7 and result.skipped == {}
    # only the .json members were read: no byte of any image member
    manifest = Manifest.load(str(tmp_path / "a"))
    image_ranges, json_bytes = {}, 0
    for s in manifest.shards:
        ix = SampleIndex.load(str(tmp_path / "a" / s.index))
        image_ranges[s.name] = list(zip(ix.img_offset.tolist(), (ix.img_offset + ix.img_size).tolist()))
        json_bytes += int(ix.meta_size.sum())
    read = [(url.rsplit("/", 1)[-1], r) for url, ranges in seen for r in ranges]
    assert sum(e - s for _, (s, e) in read) == json_bytes
    for name, (s, e) in read:
        assert all(e <= a or s >= b for a, b in image_ranges[name])
    assert result.bytes_read < 0.05 * manifest.total_bytes
    assert {p.name: p.read_bytes() for p in (tmp_path / "a").glob("*.tar")} == tars   # shards untouched
    # the view loads exactly what sharding with LLaVA directly gives; the default view is unchanged
    assert manifest.default_view == "qwen-small" and set(manifest.views) == {"qwen-small", "llava"}
    via_view = _all_samples(VLMDataset(str(tmp_path / "a"), max_tokens=1 << 16, max_images=64, text_view="llava"))
    direct = _all_samples(VLMDataset(str(tmp_path / "b"), max_tokens=1 << 16, max_images=64))
    assert via_view.keys() == direct.keys()
    for k in direct:
        assert np.array_equal(via_view[k][0], direct[k][0]) and np.array_equal(via_view[k][1], direct[k][1])
    default = VLMDataset(str(tmp_path / "a"), max_tokens=1 << 16, max_images=64)
    assert default.model_family.name == "qwen2_vl"
    assert VLMDataset(str(tmp_path / "a"), max_tokens=1 << 16, text_view="llava").model_family.name == "llava"


def test_mixing_views_of_different_tokenizers_is_a_clear_error(folders, rows, tmp_path):
    qwen, llava = folders
    for name, model in (("a", qwen), ("b", llava)):
        shard_dataset(ShardConfig(inputs=[str(rows)], output=str(tmp_path / name), tokenizer=str(model), workers=0))
    with pytest.raises(ConfigError, match="tokenizer files or vision settings differ"):
        VLMDataset([(str(tmp_path / "a"), 1.0), (str(tmp_path / "b"), 1.0)])
    retokenize_dataset(RetokenizeConfig(dataset=str(tmp_path / "b"), tokenizer=str(qwen), workers=0))   # view "qwen-small"
    mixed = VLMDataset([(str(tmp_path / "a"), 1.0), (str(tmp_path / "b"), 1.0)], max_tokens=1 << 16, max_images=64,
                       text_view="qwen-small")
    assert mixed.model_family.name == "qwen2_vl"
    assert sum(len(b["sample_keys"]) for b in mixed) == 14      # 7 + 7 (the two datasets share keys)
    with pytest.raises(ValueError, match="no text view 'nope'"):
        VLMDataset(str(tmp_path / "a"), text_view="nope")


def test_cli_retokenize_of_a_byte_tokenizer_dataset(folders, rows, tmp_path, capsys):
    qwen, _ = folders
    shard_dataset(ShardConfig(inputs=[str(rows)], output=str(tmp_path / "d"), workers=0))
    assert main(["retokenize", str(tmp_path / "d"), "--tokenizer", str(qwen), "--workers", "0"]) == 0
    assert "view qwen-small: 7 of 7 samples encoded" in capsys.readouterr().out
    m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert m["version"] == 2 and m["default_view"] == "default" and set(m["views"]) == {"default", "qwen-small"}
    assert main(["retokenize", str(tmp_path / "d"), "--tokenizer", str(qwen), "--workers", "0"]) == 2
    assert "already has a text view" in capsys.readouterr().err
    old = VLMDataset(str(tmp_path / "d"), max_tokens=1 << 16, max_images=64)
    assert old.model_family is None and old.policy.size == 336
    new = VLMDataset(str(tmp_path / "d"), max_tokens=1 << 16, max_images=64, text_view="qwen-small")
    assert new.model_family.name == "qwen2_vl" and len(_all_samples(new)) == 7


def test_an_oversized_stored_text_is_a_counted_skip_never_read(folders, tmp_path, monkeypatch):
    """One huge caption must not make retokenize read and tokenize it (a 20 MB one took ~5 GB); the workers it
    starts die with it (sysinfo.die_with_parent as the pool's initializer)."""
    from tests.helpers.shards import jpeg
    from vlmdata.sysinfo import die_with_parent

    qwen, _ = folders
    (tmp_path / "a.jpg").write_bytes(jpeg(32, 32))
    big = "word " * 40_000                                  # 200 KB of stored text
    rows = [{"id": f"r{i}", "image": "a.jpg", "conversations": [
        {"from": "human", "value": "<image>\nDescribe."}, {"from": "gpt", "value": big if i == 3 else f"cap {i}"}]}
        for i in range(6)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shard_dataset(ShardConfig(inputs=[str(tmp_path / "d.jsonl")], output=str(tmp_path / "ds"), workers=0,
                              max_samples_per_shard=3))
    pools = []
    real_pool = retok_module.ProcessPoolExecutor

    def pool(*args, **kwargs):
        pools.append(kwargs.get("initializer"))
        return real_pool(*args, **kwargs)

    monkeypatch.setattr(retok_module, "ProcessPoolExecutor", pool)
    result = retokenize_dataset(RetokenizeConfig(dataset=str(tmp_path / "ds"), tokenizer=str(qwen), view="q",
                                                 workers=2, max_text_bytes=64 << 10))
    assert result.skipped == {"text_too_large": 1} and result.encoded == 5 and result.samples == 6
    assert result.bytes_read < len(big)                     # the big record was never read
    assert pools == [die_with_parent]
    ds = VLMDataset(str(tmp_path / "ds"), max_tokens=1 << 12, max_images=8, text_view="q")
    assert sorted(k for b in ds for k in b["sample_keys"]) == ["r0", "r1", "r2", "r4", "r5"]


@pytest.mark.slow
def test_a_pan_and_scan_view_writes_each_images_text_from_its_stored_size(tmp_path):
    """Gemma 3 with pan-and-scan, whose text before an image depends on the image's size: a view retokenized
    from a dataset sharded without it equals sharding with it (the index's stored sizes reach the text)."""
    from tests.helpers.gemma3 import shard_corpus
    from vlmdata.testing import gemma3_folder

    small = {"image_size": 224, "tokens_per_image": 16}
    pas = gemma3_folder(tmp_path / "pas", do_pan_and_scan=True, **small)
    rows, _, direct = shard_corpus(pas, tmp_path / "direct")
    shard_dataset(ShardConfig(inputs=[str(rows)], output=str(tmp_path / "a"), tokenizer=str(gemma3_folder(
        tmp_path / "off", **small)), workers=0, max_samples_per_shard=5))
    result = retokenize_dataset(RetokenizeConfig(dataset=str(tmp_path / "a"), tokenizer=str(pas), view="pas",
                                                 workers=0))
    assert result.skipped == {} and result.encoded == result.samples
    via_view = _all_samples(VLMDataset(str(tmp_path / "a"), max_tokens=1 << 16, max_images=64, text_view="pas"))
    want = _all_samples(VLMDataset(str(direct), max_tokens=1 << 16, max_images=64))
    plain = _all_samples(VLMDataset(str(tmp_path / "a"), max_tokens=1 << 16, max_images=64))
    assert via_view.keys() == want.keys() == plain.keys()
    assert sum(len(want[k][0]) != len(plain[k][0]) for k in want) >= 3          # crops changed some samples
    for k in want:
        assert np.array_equal(via_view[k][0], want[k][0]) and np.array_equal(via_view[k][1], want[k][1])
