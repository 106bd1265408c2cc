"""Collate: placeholder expansion, labels, truncation, patches, PackedBatch fields."""
import numpy as np
import pytest

from vlmdata.decode import DynamicPolicy, FixedPolicy, pack_patches
from vlmdata.loading import IGNORE, CollateConfig, collate_bucket, collate_pack, prepare_sample
from vlmdata.metrics import StatsDelta
from vlmdata.text import ByteTokenizer, encode_conversation

TOK = ByteTokenizer()
IMG = TOK.special.image


FIXED56 = FixedPolicy(56, 14)


def cfg(policy=FIXED56, max_tokens=4096):
    return CollateConfig(policy=policy, image_token_id=IMG, pad_token_id=TOK.special.pad, max_tokens=max_tokens)


def sample(k=1, text="a cat on a mat"):
    tokens = encode_conversation(TOK, [("user", "<image>" * k + "What is it?"), ("assistant", text)], k)
    images = [np.full((56, 56, 3), j, np.uint8) for j in range(k)]
    return tokens, images, [(100, 80)] * k


def test_expansion_and_labels():
    tokens, images, sizes = sample(k=2)
    s, truncated = prepare_sample("x", tokens, images, sizes, cfg())
    assert not truncated
    per_image = FixedPolicy(56, 14).tokens_per_image          # 16
    assert len(s.ids) == tokens.shape[1] - 2 + 2 * per_image
    assert (s.ids == IMG).sum() == 2 * per_image
    assert (s.labels[s.ids == IMG] == IGNORE).all()
    assert s.labels[0] == IGNORE
    # loss only on the assistant text and its EOS
    assistant_text = TOK.encode("a cat on a mat").tolist() + [TOK.special.eos]
    assert [int(t) for t in s.labels if t != IGNORE] == assistant_text


def test_truncation_never_splits_an_image():
    tokens = encode_conversation(TOK, [("user", "hi <image> there <image>"), ("assistant", "x" * 100)], 2)
    images = [np.zeros((56, 56, 3), np.uint8)] * 2
    full, _ = prepare_sample("x", tokens, images, [(56, 56)] * 2, cfg())
    second_image_start = int(np.flatnonzero(full.ids == IMG)[16])
    cut = second_image_start + 5                              # would land inside the second image
    s, truncated = prepare_sample("x", tokens, images, [(56, 56)] * 2, cfg(max_tokens=cut))
    assert truncated
    assert len(s.ids) == second_image_start                  # moved before the image
    assert len(s.images) == 1 and (s.ids == IMG).sum() == 16
    s, truncated = prepare_sample("x", tokens, images, [(56, 56)] * 2, cfg(max_tokens=len(full.ids) - 30))
    assert truncated and len(s.ids) == len(full.ids) - 30 and len(s.images) == 2


def test_placeholder_mismatch_is_an_error():
    tokens, images, sizes = sample(k=2)
    with pytest.raises(ValueError, match="placeholders"):
        prepare_sample("x", tokens, images[:1], sizes[:1], cfg())


def test_collate_pack_fields():
    c = cfg()
    parts = [prepare_sample(f"k{i}", *sample(k=i % 3, text="t" * (5 + i)), c)[0] for i in range(5)]
    stats = StatsDelta()
    b = collate_pack(parts, c, stats)
    lengths = [len(p.ids) for p in parts]
    assert b["cu_seqlens"].tolist() == np.concatenate([[0], np.cumsum(lengths)]).tolist()
    assert str(b["cu_seqlens"].dtype) == "torch.int32" and str(b["input_ids"].dtype) == "torch.int64"
    assert b["max_seqlen"] == max(lengths)
    pos = b["position_ids"].tolist()
    assert pos == [j for n in lengths for j in range(n)]
    assert b["labels"][b["cu_seqlens"][:-1].long()].eq(IGNORE).all()
    n_img = sum(i % 3 for i in range(5))
    assert tuple(b["pixel_values"].shape) == (n_img, 3, 56, 56) and str(b["pixel_values"].dtype) == "torch.uint8"
    assert b["sample_keys"] == [f"k{i}" for i in range(5)]
    assert stats.samples == 5 and stats.images == n_img and stats.real_tokens == sum(lengths)


def test_empty_pack_is_one_padding_token():
    stats = StatsDelta()
    b = collate_pack([], cfg(), stats)
    assert b["input_ids"].tolist() == [TOK.special.pad] and b["labels"].tolist() == [IGNORE]
    assert b["cu_seqlens"].tolist() == [0, 1] and b["sample_keys"] == []
    assert tuple(b["pixel_values"].shape) == (0, 3, 56, 56)
    assert stats.samples == 0 and stats.packs == 1


def test_dynamic_policy_batch():
    pol = DynamicPolicy(patch=14, merge=2, min_pixels=56 * 56, max_pixels=112 * 112)
    c = cfg(policy=pol)
    sizes = [(300, 150), (60, 90)]
    targets = [pol.target_size(w, h) for w, h in sizes]
    images = [np.zeros((h, w, 3), np.uint8) for w, h in targets]
    tokens = encode_conversation(TOK, [("user", "<image><image>hi"), ("assistant", "ok")], 2)
    s, _ = prepare_sample("d", tokens, images, sizes, c)
    b = collate_pack([s], c, StatsDelta())
    grids = [pol.grid(w, h) for w, h in sizes]
    assert b["image_grid"].tolist() == [[1, gh, gw] for gh, gw in grids]
    counts = [gh * gw for gh, gw in grids]
    assert b["vision_cu_seqlens"].tolist() == [0, counts[0], sum(counts)]
    assert tuple(b["pixel_values"].shape) == (sum(counts), 3 * 14 * 14)
    assert int((b["input_ids"] == IMG).sum()) == sum(n // 4 for n in counts)   # merge 2x2 -> tokens
    patches, grid, cu = pack_patches([], 14, 2)
    assert patches.shape == (0, 588) and grid.shape == (0, 3) and cu.tolist() == [0]


def test_collate_bucket_padding():
    c = cfg()
    parts = [prepare_sample(f"k{i}", *sample(k=1, text="t" * (5 + 10 * i)), c)[0] for i in range(3)]
    stats = StatsDelta()
    b = collate_bucket(parts, c, stats)
    lengths = [len(p.ids) for p in parts]
    assert tuple(b["input_ids"].shape) == (3, max(lengths))
    assert b["attention_mask"].sum(1).tolist() == lengths
    assert (b["labels"][b["attention_mask"] == 0] == IGNORE).all()
    assert (b["input_ids"][b["attention_mask"] == 0] == TOK.special.pad).all()
    assert stats.padded_tokens == 3 * max(lengths) - sum(lengths)


def test_deferred_decode_carries_bytes():
    c = CollateConfig(policy=FixedPolicy(56, 14), image_token_id=IMG, pad_token_id=TOK.special.pad,
                      max_tokens=4096, defer_decode=True)
    tokens = encode_conversation(TOK, [("user", "<image>hi"), ("assistant", "ok")], 1)
    s, _ = prepare_sample("d", tokens, [memoryview(b"\xff\xd8abc")], [(640, 480)], c)
    b = collate_pack([s], c, StatsDelta())
    assert "pixel_values" not in b
    assert all(isinstance(x, np.ndarray) and x.dtype == np.uint8 for x in b["image_bytes"])
    assert [bytes(x) for x in b["image_bytes"]] == [b"\xff\xd8abc"] and b["image_sizes"].tolist() == [[640, 480]]
