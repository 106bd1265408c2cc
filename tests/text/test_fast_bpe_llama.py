"""The exact fast BPE path on LLaMA-style vocabularies against `tokenizers` itself, on hostile text.

Vocabularies, real, built at test time from PyPI wheels (vlmdata.testing.llama_tokenizers): Llama 3's
(tiktoken ranks, Split + ByteLevel, ignore_merges, `<|begin_of_text|>` post-processor) and Mistral 7B's
SentencePiece BPE in both of transformers' conversions (Prepend/Replace normalizer; Metaspace
pre-tokenizer), plus edits of them the path must refuse. Reference: the same `tokenizers.Tokenizer`'s
`encode` (ids, offsets, char_to_token), and the family's `tokenizers` path for ids and trained spans.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.bpe_checks import (
    UNASSIGNED,
    assert_family_path_unchanged,
    assert_same_encodings,
    hostile_conversations,
    hostile_texts,
)
from tests.helpers.models import llama_or_skip
from vlmdata.testing import default_cache, llama3_llava_folder, mistral_llava_folder, mistral_tokenizer
from vlmdata.text import FastBPE, MetaspaceBPE, build_fast_path, encode_texts
from vlmdata.text.families import load_family

pytestmark = pytest.mark.slow                 # ~40 s in all: loading three real vocabularies

LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>", "<image>", "<|start_header_id|>",
                   "<|end_header_id|>")
MISTRAL_SPECIALS = ("<s>", "</s>", "<unk>", "<image>", "<pad>", "</s>")


SPECIALS = {"llama3": LLAMA3_SPECIALS, "mistral-legacy": MISTRAL_SPECIALS, "mistral-metaspace": MISTRAL_SPECIALS}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """name -> its LLaVA-style family, loaded once per module."""
    families = {}

    def load(name: str):
        if name not in families:
            out = tmp_path_factory.mktemp(name)
            folder = (llama_or_skip(llama3_llava_folder, out, default_cache()) if name == "llama3" else
                      llama_or_skip(mistral_llava_folder, out, default_cache(), name.split("-")[1]))
            families[name] = load_family(str(folder))
        fam = families[name]
        fam.fast_bpe.clear_cache()              # as a fresh shard worker has it
        return fam
    return load


@pytest.mark.parametrize("name, kind", [("llama3", FastBPE), ("mistral-legacy", MetaspaceBPE),
                                        ("mistral-metaspace", MetaspaceBPE)])
def test_llama_style_vocabularies_take_the_fast_path(loaded, name, kind):
    fam = loaded(name)
    assert type(fam.fast_bpe) is kind, fam.fast_bpe_reason
    assert fam.fast_bpe_reason is None


@pytest.mark.parametrize("flag", [True, False])
def test_llama3_ids_and_offsets_equal_tokenizers_on_hostile_text(loaded, flag):
    llama3 = loaded("llama3")
    texts = hostile_texts(seed=7, specials=LLAMA3_SPECIALS)
    counts = assert_same_encodings(llama3, texts, add_special_tokens=flag)
    # no normalizer: only characters Python's tables cannot classify send a text to tokenizers
    handed = [t for t in texts if llama3.fast_bpe.encode(t) is None]
    assert {f"unassigned {c} here" for c in UNASSIGNED} <= set(handed)
    assert counts["fallback"] == len(handed) and counts["fast"] >= len(texts) // 2, counts
    # Llama 3 groups digits in threes, unlike Qwen2: the pieces the path cut are the pre-tokenizer's
    pieces, _, _ = llama3.fast_bpe.split("1234567 x")
    assert pieces == ["123", "456", "7", " x"]


@pytest.mark.parametrize("name", ["mistral-legacy", "mistral-metaspace"])
@pytest.mark.parametrize("flag", [True, False])
def test_mistral_ids_and_offsets_equal_tokenizers_on_hostile_text(loaded, name, flag):
    mistral = loaded(name)
    texts = hostile_texts(seed=8, specials=MISTRAL_SPECIALS)
    counts = assert_same_encodings(mistral, texts, add_special_tokens=flag)
    # a text that already holds the "▁" is the only one handed over: no Unicode tables are involved
    handed = [t for t in texts if mistral.fast_bpe.encode(t) is None]
    assert handed == [t for t in texts if "▁" in t] and handed
    assert counts["fallback"] == len(handed) and counts["fast"] >= len(texts) // 2, counts


@pytest.mark.parametrize("name", list(SPECIALS))
def test_trained_spans_equal_the_tokenizers_path(loaded, name):
    texts = [t for t in hostile_texts(seed=9, specials=SPECIALS[name]) if "<image>" not in t]
    assert_family_path_unchanged(loaded(name), hostile_conversations(texts))


@pytest.mark.parametrize("name", list(SPECIALS))
def test_text_of_new_words_is_learned_from_tokenizers(loaded, name):
    fam = loaded(name)
    rng = np.random.default_rng(5)
    texts = [" ".join("".join(map(chr, rng.integers(97, 123, 6))) for _ in range(50)) + " 漢字 😀" for _ in range(20)]
    assert assert_same_encodings(fam, texts)["cold"] == len(texts)
    assert assert_same_encodings(fam, texts) == {"fast": len(texts), "cold": 0, "fallback": 0}
    # what was learned from tokenizers' ids is the tokenizer's own BPE of each piece alone
    model_input = fam.fast_bpe._model_input
    for text in texts[:3]:
        pieces, entries, _ = fam.fast_bpe.split(text)
        assert entries == [tuple(t.id for t in fam.tokenizer.model.tokenize(model_input(p))) for p in pieces]


def _mistral_cfg() -> dict:
    return json.loads(llama_or_skip(mistral_tokenizer, default_cache(), "legacy").to_str())


def _crossing_token(cfg: dict) -> None:
    vocab = cfg["model"]["vocab"]
    vocab["a▁b"] = len(vocab)
    vocab["a▁"] = len(vocab)
    cfg["model"]["merges"] += [["a", "▁"], ["a▁", "b"]]


def _metaspace(**fields):
    def change(cfg: dict) -> None:
        cfg["normalizer"] = None
        cfg["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False,
                                **fields}
    return change


@pytest.mark.parametrize("change, reason", [
    (_crossing_token, "across a word start"),
    (lambda c: c["model"].__setitem__("ignore_merges", True), "ignore_merges"),
    (lambda c: c["model"].__setitem__("byte_fallback", False), "byte fallback"),
    (lambda c: c["model"]["vocab"].pop("<0x0A>"), "byte fallback"),
    (_metaspace(split=True), "Metaspace form"),
    (lambda c: c["normalizer"]["normalizers"].append({"type": "NFKC"}), "Metaspace form"),
    (lambda c: c["normalizer"]["normalizers"][1].__setitem__("content", "_"), "Metaspace form"),
    (lambda c: c.__setitem__("added_tokens", [*c["added_tokens"], {
        "id": 32000, "content": "[INST]", "single_word": False, "lstrip": True, "rstrip": False, "normalized": False,
        "special": True}]), "lstrip"),
])
def test_what_the_metaspace_path_does_not_reproduce_is_refused(change, reason):
    from tokenizers import Tokenizer

    cfg = _mistral_cfg()
    change(cfg)
    tok = Tokenizer.from_str(json.dumps(cfg))
    fast, why = build_fast_path(tok, json.dumps(cfg))
    assert fast is None and reason in why, why
    texts = ["a▁b and ab a bb", " USER: hi\n [INST] x"]
    for text, enc in zip(texts, encode_texts(fast, tok, texts, True)):
        assert enc.ids == tok.encode(text).ids


@pytest.mark.parametrize("scheme", ["first", "always", "never"])
def test_each_metaspace_prepend_scheme_gives_tokenizers_ids(scheme):
    from tokenizers import Tokenizer

    cfg = _mistral_cfg()
    _metaspace(prepend_scheme=scheme)(cfg)
    tok = Tokenizer.from_str(json.dumps(cfg))
    fast, why = build_fast_path(tok, json.dumps(cfg))
    assert type(fast) is MetaspaceBPE, why
    texts = [t for t in hostile_texts(seed=10, specials=MISTRAL_SPECIALS) if "▁" not in t]
    for text, enc in zip(texts, encode_texts(fast, tok, texts, True)):
        ref = tok.encode(text)
        assert (enc.ids, enc.offsets) == (ref.ids, ref.offsets), text
        assert fast.encode(text) is not None
