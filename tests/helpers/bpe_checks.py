"""Checks of an exact fast BPE path against `tokenizers` itself: hostile texts, ids, offsets, trained spans."""
from __future__ import annotations

import numpy as np

from vlmdata.text import Conversation, FastEncoding, encode_texts

# Characters Python 3.10-3.13's Unicode tables (14.0-15.0) leave unassigned: U+1CC00 (Unicode 16) and an
# unassigned plane-3 code point.
UNASSIGNED = "\U0001cc00\U00031350"
NOT_NFC = ("cafe\u0301", "\u1100\u1161\u11a8 jamo", "a\u0323\u0307 marks out of order", "\u212b angstrom",
           "A\u030a ring")


QWEN_SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|image_pad|>", "<|vision_start|>", "<|vision_end|>")


def hostile_texts(seed: int = 0, specials: tuple[str, ...] = QWEN_SPECIALS) -> list[str]:
    """Text that stresses every step: scripts, emoji, marks, whitespace runs, digits, contractions, added
    tokens (`specials`: the vocabulary's, the first two a begin/end pair, at least six)."""
    rng = np.random.default_rng(seed)
    start, end, other, pad, vstart, vend = specials[:6]
    fixed = [
        "", " ", "  ", "\n", "\r\n", "hello world", "  leading and trailing  ", "tabs\t\tand\x0b\x0cfeeds",
        "runs of spaces" + " " * 37 + "end", "\n\n\n   \n\t \r\n  x", "trailing newline spaces   \n   ",
        "digits 1234567890 3.14159 1,000,000 ²³ ⅫⅣ ١٢٣ ０１２", "I'm you'RE they've HE'LL 'S 'ſ 'ſt 'K 'Ｓ",
        "naïve café Привет мир Ελληνικά עברית العربية हिन्दी ไทย 한국어 日本語の文章 中文字符",
        "emoji 😀👍🏽👨‍👩‍👧‍👦🏳️‍🌈 ☕ ✨ 🫠", "zero\u200bwidth\u200djoin\ufeffbom \u00a0nbsp \u2028ls \u2029ps \x85nel",
        "controls \x00\x01\x1c\x1d\x1e\x1f\x7f end", "𝐀𝐁𝐂 math letters 𝟙𝟚", "Kelvin \u212a and long s ſ",
        f"special {start}inside{end} text {other}{pad} and partial {start[:-3]}",
        f"{vstart}{pad}{vend}", f"{end}{end}x{end}", f"{start} leading space{end}  two{end}\n",
        "punctuation!!! ... ??? --- ((())) [[]] {{}} <<>> @#$%^&*", "mixed:abc123def456 a1b2 x=1+2",
        "e\u0301 but NFC-stable é", "\u0301 starts with a mark", "x" * 300, "ab " * 200, "a literal ▁ sentencepiece ▁space",
        *NOT_NFC, *(f"unassigned {c} here" for c in UNASSIGNED),
    ]
    random = []
    for _ in range(60):
        raw = bytes(rng.integers(0, 256, int(rng.integers(1, 80))).tolist())
        random.append(raw.decode("utf-8", errors="replace"))
        random.append(raw.decode("latin-1"))
    for _ in range(60):
        cps = rng.integers(0x20, 0x30000, int(rng.integers(1, 30)))
        random.append("".join(chr(int(c)) for c in cps if not 0xD800 <= c < 0xE000))
    for _ in range(40):
        pieces = rng.choice([" ", "  ", "\n", "a", "Zz", "12", "é", "😀", "'s", end, "日本", "\t", ".", "\u0301"],
                            int(rng.integers(1, 40)))
        random.append("".join(pieces))
    return fixed + random


def _overlapping(offsets: np.ndarray, a: int, b: int) -> tuple[int | None, int | None]:
    """The first and last of the reference's tokens whose (start, end) overlap [a, b)."""
    over = np.flatnonzero((offsets[:, 0] < b) & (offsets[:, 1] > a))
    return (int(over[0]), int(over[-1])) if len(over) else (None, None)


def assert_same_encodings(fam, texts, add_special_tokens: bool = True) -> dict:
    """Every text's fast encoding (where the fast path takes it) equals tokenizers' ids and offsets."""
    fast = fam.fast_bpe
    before = dict(fast.stats)
    mine = encode_texts(fast, fam.tokenizer, texts, add_special_tokens)
    theirs = fam.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
    counts = {k: fast.stats[k] - before[k] for k in before}
    # encode() never hands a text of new words to tokenizers: every text the path can take is checked on it
    direct = [fast.encode(t, add_special_tokens) for t in texts]
    for text, a, b, d in zip(texts, mine, theirs, direct):
        for enc in (a, d) if d is not None else (a,):
            assert enc.ids == b.ids, text
            assert enc.offsets == b.offsets, text
            for pos in range(len(text)):
                assert enc.char_to_token(pos) == b.char_to_token(pos), (text, pos)
            if not isinstance(enc, FastEncoding):
                continue                             # handed to tokenizers: it is the reference
            offsets = np.asarray(b.offsets, dtype=np.int64).reshape(-1, 2)
            n = len(text)
            for span in ((0, n), (1, n - 1), (n // 3, 2 * n // 3), (n // 2, n // 2 + 1), (n, n + 1), (-1, 0), (-1, 2)):
                assert enc.tokens_over(*span) == _overlapping(offsets, *span), (text, span)
    return counts


def hostile_conversations(texts: list[str]) -> list[Conversation]:
    out = []
    for i in range(0, len(texts) - 1, 2):
        out.append(Conversation([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": texts[i]}]},
                                 {"role": "assistant", "content": [{"type": "text", "text": texts[i + 1]}]},
                                 {"role": "user", "content": [{"type": "text", "text": texts[i + 1][::-1]}]},
                                 {"role": "assistant", "content": [{"type": "text", "text": texts[i]}]}], 1))
    return out


def assert_family_path_unchanged(fam, convs) -> None:
    """ids and trained-span flags of encode_batch with the fast path equal those of the tokenizers path
    (pieces learned first, so that the fast path, not the hand-over of new words, encodes them)."""
    for conv in convs:
        fam.fast_bpe.encode(fam.render(conv)[0])
    before = dict(fam.fast_bpe.stats)
    fast_out = fam.encode_batch(convs)
    assert fam.fast_bpe.stats["cold"] == before["cold"]
    assert fam.fast_bpe.stats["fast"] - before["fast"] >= len(convs) // 2
    saved, fam.fast_bpe = fam.fast_bpe, None
    try:
        ref_out = fam.encode_batch(convs)
    finally:
        fam.fast_bpe = saved
    assert len(fast_out) == len(ref_out)
    for a, b in zip(fast_out, ref_out):
        if isinstance(b, Exception):
            assert type(a) is type(b) and str(a) == str(b)
        else:
            np.testing.assert_array_equal(a, b)
