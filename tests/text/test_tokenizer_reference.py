"""The fast conversation encoding used by sharding equals the straightforward numpy version, bit for bit.

(Its companion for the token member, tokens_to_npy == np.save, is in tests/formats/test_sample.py.)"""
from __future__ import annotations

import numpy as np
import pytest

from vlmdata.text import IMAGE_MARKER, ByteTokenizer, encode_conversation, load_tokenizer


def reference_encode(tok, turns, n_images):
    """The earlier implementation (one numpy array per piece, concatenated, image loss masked)."""
    sp = tok.special
    markers = sum(t.count(IMAGE_MARKER) for _, t in turns)
    ids, loss = [np.array([sp.bos], np.int32)], [np.zeros(1, np.int8)]
    pending = n_images if markers == 0 else 0
    for role, text in turns:
        a = role == "assistant"
        pieces = []
        for i, piece in enumerate(text.split(IMAGE_MARKER)):
            if i:
                pieces.append(np.array([sp.image], np.int32))
            if piece:
                pieces.append(np.asarray(tok.encode(piece), np.int32))
        body = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
        if pending and not a:
            body = np.concatenate([np.full(pending, sp.image, np.int32), body])
            pending = 0
        ids += [np.array([sp.assistant if a else sp.user], np.int32), body]
        loss += [np.zeros(1, np.int8), np.full(len(body), int(a), np.int8)]
        if a:
            ids.append(np.array([sp.eos], np.int32))
            loss.append(np.ones(1, np.int8))
    if pending:
        ids.insert(1, np.full(pending, sp.image, np.int32))
        loss.insert(1, np.zeros(pending, np.int8))
    flat = np.concatenate(ids)
    flat_loss = np.concatenate(loss).astype(np.int32)
    flat_loss[flat == sp.image] = 0
    return np.stack([flat, flat_loss])


def random_turns(rng):
    words = ["a", "red", "box", "é", "☕", IMAGE_MARKER, " ", "\n", "x" * 40, ""]
    turns = []
    for _ in range(int(rng.integers(0, 5))):
        text = "".join(words[i] for i in rng.integers(0, len(words), int(rng.integers(0, 8))))
        turns.append(("assistant" if rng.random() < 0.5 else "user", text))
    markers = sum(t.count(IMAGE_MARKER) for _, t in turns)
    return turns, markers or int(rng.integers(0, 4))


@pytest.fixture(scope="module")
def hf_tok(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "red": 1, "box": 2, "a": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("tok") / "tok.json"
    tok.save(str(path))
    return load_tokenizer(str(path))


def test_encode_conversation_equals_reference(hf_tok):
    rng = np.random.default_rng(0)
    for tok in (ByteTokenizer(), hf_tok):
        for _ in range(400):
            turns, n = random_turns(rng)
            got = encode_conversation(tok, turns, n)
            want = reference_encode(tok, turns, n)
            assert got.dtype == np.int32 and np.array_equal(got, want), turns
    # literal special-token text in an HF tokenizer still gets no loss
    out = encode_conversation(hf_tok, [("user", "hi"), ("assistant", "red <|image|> box")], 0)
    assert int((out[0] == hf_tok.special.image).sum()) == 1 and out[1][out[0] == hf_tok.special.image].sum() == 0
