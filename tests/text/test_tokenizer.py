import numpy as np
import pytest

from vlmdata.text import ByteTokenizer, encode_conversation


def test_byte_tokenizer_round_trip_utf8():
    tok = ByteTokenizer()
    text = "naïve café ☕"
    ids = tok.encode(text)
    assert ids.dtype == np.int32
    assert len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_conversation_layout_and_loss_flags():
    tok = ByteTokenizer()
    sp = tok.special
    out = encode_conversation(tok, [("user", "<image>\nhi"), ("assistant", "ok")], n_images=1)
    ids, loss = out
    assert out.shape == (2, len(ids)) and out.dtype == np.int32
    expected = [sp.bos, sp.user, sp.image, *b"\nhi", sp.assistant, *b"ok", sp.eos]
    assert ids.tolist() == expected
    # loss only on the assistant text and its end-of-turn token
    assert loss.tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]


def test_caption_style_places_images_in_first_user_turn():
    tok = ByteTokenizer()
    ids, loss = encode_conversation(tok, [("user", ""), ("assistant", "a cat")], n_images=2)
    sp = tok.special
    assert ids[:4].tolist() == [sp.bos, sp.user, sp.image, sp.image]
    assert int((ids == sp.image).sum()) == 2
    assert loss[ids == sp.image].sum() == 0
    assert tok.decode(ids[loss == 1]) == "a cat"


def test_marker_count_mismatch_is_an_error():
    tok = ByteTokenizer()
    with pytest.raises(ValueError, match="markers"):
        encode_conversation(tok, [("user", "<image><image>"), ("assistant", "x")], n_images=1)
