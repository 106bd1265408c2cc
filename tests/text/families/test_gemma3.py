"""Gemma 3 (issue 21) against transformers' own Gemma3Processor (Gemma3ImageProcessorPil, GemmaTokenizer) on a
Gemma-style tokenizer built with `tokenizers` and Gemma 3's real chat template: the family is detected and a
contradicting `--family` refused, 256 tokens per image for 10^4 random sizes, pan-and-scan (a folder with
do_pan_and_scan true, laid out as Gemma3Processor called with do_pan_and_scan=True): crop counts for 10^4
random sizes equal the image processor's own rule, ids, labels and the pixels of every crop equal the processor's,
the "\\n\\n" around each image tokenizes as in the processor's expanded text (texts ending and starting with
newlines and spaces), ids, trained positions and pixels of a hostile corpus sharded then loaded equal the
processor's."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from tests.helpers.exact_pixels import hf_pixels, max_diff, sized_jpegs
from tests.helpers.gemma3 import CORPUS, SIZES, shard_corpus
from tests.helpers.models import (
    chatml_assistant_positions,
    gemma3_processor,
    samples_of,
)
from tests.helpers.sizes import log_uniform_sizes
from vlmdata import VLMDataset
from vlmdata.decode import ExactDecoder, make_policy
from vlmdata.errors import ConfigError
from vlmdata.hf import ModelSpec, make_adapter, take_meta
from vlmdata.ingest import check_image
from vlmdata.testing import gemma3_folder
from vlmdata.text import Conversation, TemplateError
from vlmdata.text.families import PAN_AND_SCAN_DEFAULTS, load_family, replace_marked


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return gemma3_folder(tmp_path_factory.mktemp("gemma3"))


@pytest.fixture(scope="module")
def processor(folder):
    return gemma3_processor(folder)


def test_family_is_detected_with_the_processor_settings(folder, processor):
    fam = load_family(str(folder))
    assert fam.name == "gemma3"
    tok, ip, v = processor.tokenizer, processor.image_processor, fam.vision
    assert (v.image_token_id, v.vision_start_id, v.vision_end_id) == (tok.image_token_id, tok.boi_token_id,
                                                                      tok.eoi_token_id)
    assert v.image_mean == tuple(ip.image_mean) and v.image_std == tuple(ip.image_std)
    assert v.resample == int(ip.resample) == 2 and v.policy["tile"] == ip.size["height"] == 896
    assert v.policy["tokens_per_image"] == processor.image_seq_length == 256
    assert fam.bos_token_id == tok.bos_token_id and fam.pad_token_id == tok.pad_token_id
    assert fam.eot_ids == {tok.convert_tokens_to_ids("<end_of_turn>")}
    assert fam.placeholder_text() == processor.full_image_sequence.replace(tok.image_token * 256, tok.image_token)


def test_a_family_that_contradicts_the_folder_is_refused(folder, tmp_path):
    with pytest.raises(ConfigError, match="--family qwen2_vl contradicts .*model_type 'gemma3'.*gemma3 family"):
        load_family(str(folder), family="qwen2_vl")
    assert load_family(str(folder), family="gemma3").name == "gemma3"
    bare = tmp_path / "processor-only"          # no config.json: the processor class tells
    shutil.copytree(folder, bare)
    (bare / "config.json").unlink()
    assert load_family(str(bare)).name == "gemma3"
    with pytest.raises(ConfigError, match="--family llava contradicts .*'Gemma3Processor'"):
        load_family(str(bare), family="llava")


@pytest.fixture(scope="module")
def pas_folder(tmp_path_factory):
    return gemma3_folder(tmp_path_factory.mktemp("gemma3-pas"), do_pan_and_scan=True)


def test_pan_and_scan_follows_the_processor_called_with_it(tmp_path, pas_folder):
    """The processor crops only when called with do_pan_and_scan=True, whatever the folder says, and then with
    its own settings, not the folder's: vlmdata pans a do_pan_and_scan folder with those settings and refuses
    a folder whose pan_and_scan_* values differ from them."""
    from PIL import Image

    wide = Image.new("RGB", (1200, 300), (9, 99, 199))               # 4 crops by the processor's defaults
    custom = gemma3_folder(tmp_path / "custom", do_pan_and_scan=True, pan_and_scan_max_num_crops=2,
                           pan_and_scan_min_crop_size=100, pan_and_scan_min_ratio_to_activate=1.5)
    proc = gemma3_processor(custom)
    assert PAN_AND_SCAN_DEFAULTS.items() <= proc.images_kwargs.items()
    assert proc(text=["<start_of_image>"], images=[[wide]], return_tensors="np")["pixel_values"].shape[0] == 1
    called = proc(text=["<start_of_image>"], images=[[wide]], do_pan_and_scan=True, return_tensors="np")
    alone = proc.image_processor(images=[wide], return_tensors="np")          # the folder's max 2 crops
    assert called["pixel_values"].shape[0] == 5 and alone["pixel_values"].shape[0] == 3
    with pytest.raises(ConfigError, match="pan_and_scan_max_num_crops.*Gemma3Processor called with do_pan_and_scan"):
        load_family(str(custom))
    policy = load_family(str(pas_folder)).vision.image_policy()
    assert policy.pan_and_scan and int(policy.tiles(1200, 300)) == 5
    assert not load_family(str(gemma3_folder(tmp_path / "off", do_pan_and_scan=False))).vision.policy["pan_and_scan"]
    odd = gemma3_folder(tmp_path / "odd")
    cfg = json.loads((odd / "processor_config.json").read_text())
    (odd / "processor_config.json").write_text(json.dumps({**cfg, "image_seq_length": 64}))
    with pytest.raises(ConfigError, match="image_seq_length and config.json mm_tokens_per_image disagree"):
        load_family(str(odd))


def test_pan_and_scan_crop_counts_equal_the_processor_for_random_sizes(pas_folder, processor):
    """10^4 log-uniform sizes of 1 to 10,000 px against Gemma3ImageProcessorPil.pan_and_scan itself (on
    zero-copy arrays of each size, with the processor's settings); the planner's token count is the length of
    the expansion the loader builds; the processor run on real images of each crop count writes as many soft
    tokens and images."""
    from PIL import Image

    policy = load_family(str(pas_folder)).vision.image_policy()
    w, h = log_uniform_sizes(10_000, 5, 10_000)
    rule = processor.image_processor
    blank = np.zeros((1, 1, 1), np.uint8)
    want = [len(rule.pan_and_scan(np.broadcast_to(blank, (3, b, a)), **PAN_AND_SCAN_DEFAULTS))
            for a, b in zip(w.tolist(), h.tolist())]
    got = policy.crops(w, h)
    assert np.array_equal(got, want) and set(want) == {0, 2, 3, 4}
    assert np.array_equal(policy.tiles(w, h), np.asarray(want) + 1)
    soft = processor.tokenizer.image_token_id
    for size in [(300, 300), (255, 1000), (640, 480), (1000, 300), (301, 1201)]:     # 0, 0, 2, 3 and 4 crops
        ids = policy.expansion(*size)
        assert len(ids) == int(policy.tokens(*size)) and int((ids == soft).sum()) == 256 * int(policy.tiles(*size))
        im = Image.new("RGB", size, (1, 2, 3))
        out = processor(text=["<start_of_image>"], images=[[im]], do_pan_and_scan=True, return_tensors="np")
        assert int((out["input_ids"] == soft).sum()) == 256 * out["pixel_values"].shape[0]
        assert out["pixel_values"].shape[0] == int(policy.tiles(*size))


def test_pan_and_scan_text_needs_the_image_sizes(pas_folder):
    fam = load_family(str(pas_folder))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": "yes"}]
    with pytest.raises(ConfigError, match="needs each image's width and height"):
        fam.encode(Conversation(messages, 1))
    with pytest.raises(TemplateError, match="2 image sizes for 1 images"):
        fam.encode(Conversation(messages, 1, image_sizes=((9, 9), (9, 9))))
    small, cropped = (fam.encode(Conversation(messages, 1, image_sizes=(s,)))[0] for s in ((300, 300), (1000, 300)))
    assert len(cropped) > len(small) and (cropped == fam.image_token_id).sum() == 1


def test_markers_replaced_one_by_one_move_the_trained_spans():
    text, spans = replace_marked("a<m>bb<m>c", [(0, 1), (5, 6), (9, 10)], "<m>", ["XY", "Z"])
    assert text == "aXYbbZc" and [text[a:b] for a, b in spans] == ["a", "b", "c"]
    with pytest.raises(TemplateError, match="holds 2 '<m>' markers for 1 images"):
        replace_marked("<m><m>", [], "<m>", ["x"])


def test_token_counts_equal_the_processor_for_random_sizes(folder, processor):
    """10^4 log-uniform sizes of 1 to 10,000 px (ratios up to 10^4) against `_get_num_multimodal_tokens`, and
    the processor run on 200 real images: each costs one 896 px image and 256 soft tokens."""
    policy = load_family(str(folder)).vision.image_policy()
    w, h = log_uniform_sizes(10_000, 3, 10_000)
    rng = np.random.default_rng(3)                                                 # the images' noise
    want = processor._get_num_multimodal_tokens(image_sizes=list(zip(h.tolist(), w.tolist())))
    assert np.array_equal(policy.tokens(w, h), want["num_image_tokens"])
    assert np.array_equal(policy.tiles(w, h), want["num_image_patches"])
    from PIL import Image

    soft = processor.tokenizer.image_token_id
    for a, b in zip(w[:200] % 700 + 1, h[:200] % 700 + 1):
        im = Image.fromarray(rng.integers(0, 256, (int(b), int(a), 3), dtype=np.uint8))
        out = processor(text=["<start_of_image>"], images=[[im]], return_tensors="np")
        assert int((out["input_ids"] == soft).sum()) == int(policy.tokens(a, b)) == 256
        assert out["pixel_values"].shape[0] == int(policy.tiles(a, b))


def test_newlines_around_images_tokenize_as_in_the_expanded_text(folder, processor):
    """Per conversation: vlmdata's ids with each soft token expanded to 256 equal the processor's ids of the
    template's text; the "\\n\\n" pieces do merge with the user's text in some of them (so a placeholder
    tokenized apart from its neighbours would be wrong)."""
    fam, tok = load_family(str(folder)), processor.tokenizer
    soft, boi = tok.image_token_id, tok.boi_token_id
    merged = 0
    for messages, n in CORPUS:
        text = processor.apply_chat_template(messages, tokenize=False)
        ref = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = fam.encode(Conversation(messages, n))[0]
        expanded = np.repeat(ids, np.where(ids == soft, 256, 1))
        full = processor(text=[text], images=None if not n else [[_tiny()] * n], add_special_tokens=False)
        assert np.array_equal(expanded, full["input_ids"][0]), text
        at = [i for i, t in enumerate(full["input_ids"][0]) if t == boi]
        spans = tok(processor.apply_chat_template(messages, tokenize=False).replace(
            "<start_of_image>", processor.full_image_sequence), add_special_tokens=False,
            return_offsets_mapping=True)["offset_mapping"]
        merged += sum(1 for i in at if spans[i - 1][1] - spans[i - 1][0] > 2)   # "\n\n" shares a token
        assert ref["input_ids"][0] == tok.bos_token_id
    assert merged >= 2


def test_a_reply_ending_in_byte_fallback_tokens_is_trained_whole(folder, processor):
    """A character the tokenizer spells in several byte tokens (an emoji) at the end of a reply: all of them and
    the <end_of_turn> after are trained (the trained span's last character maps to its every token)."""
    fam, tok = load_family(str(folder)), processor.tokenizer
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Oui 😀"}]}]
    ids, trained = fam.encode(Conversation(messages, 0))
    emoji = tok.encode("😀", add_special_tokens=False)
    assert len(emoji) == 4
    eot = int(np.flatnonzero(ids == tok.convert_tokens_to_ids("<end_of_turn>"))[-1])
    assert ids[eot - 4:eot].tolist() == emoji and trained[eot - 4:eot + 1].all()


def _tiny():
    from PIL import Image

    return Image.new("RGB", (5, 3), (10, 200, 30))


def test_sharded_and_loaded_ids_labels_and_pixels_equal_the_hf_processor(folder, processor, tmp_path):
    _check_sharded_against_the_processor(folder, processor, tmp_path, {})


@pytest.mark.slow
def test_pan_and_scan_ids_labels_and_every_crops_pixels_equal_the_processor(pas_folder, tmp_path):
    """The hostile corpus (multi-image, an image too small to crop, 2, 3 and 4 crops, strips that do not
    divide the side) sharded with a do_pan_and_scan folder, against Gemma3Processor(do_pan_and_scan=True)."""
    sizes = [(1000, 300), *SIZES[:3], (301, 1201), *SIZES[3:]]
    assert set(load_family(str(pas_folder)).vision.image_policy().crops(*zip(*sizes)).tolist()) == {0, 2, 3, 4}
    _check_sharded_against_the_processor(pas_folder, gemma3_processor(pas_folder), tmp_path,
                                         {"do_pan_and_scan": True, **PAN_AND_SCAN_DEFAULTS}, sizes)


def _check_sharded_against_the_processor(folder, processor, tmp_path, settings: dict, sizes=None):
    """Shard the corpus with `folder`, load it, and compare ids, image positions, trained positions and every
    image's pixels with the processor called with `settings`."""
    rows, expected, data = shard_corpus(folder, tmp_path, sizes=sizes)
    ds = VLMDataset(str(data), max_tokens=1 << 16, max_images=64, rank=0, world_size=1)
    assert ds.model_family.name == "gemma3" and ds.pixels == "exact"
    assert ModelSpec.from_dataset(ds).policy == ModelSpec.from_folder(str(folder)).policy
    adapter = make_adapter(ModelSpec.from_folder(str(folder)))      # the model's sliding window: config.json
    files = {json.loads(line)["id"]: json.loads(line)["images"] for line in rows.read_text().splitlines()}
    got, worst, compared = {}, 0.0, 0
    for pack in ds:
        got.update(samples_of(pack))
        host = adapter(pack)
        keys = take_meta(host)["sample_keys"]
        refs = [hf_pixels(processor.image_processor, (rows.parent / f).read_bytes(), **settings)
                for k in keys for f in files[k]]
        assert torch.equal(host["token_type_ids"], (host["input_ids"] == processor.tokenizer.image_token_id).long())
        if refs:
            worst = max(worst, max_diff(adapter.finalize(host)["pixel_values"],
                                        torch.cat([r["pixel_values"] for r in refs])))
            compared += len(refs)
    assert compared == sum(len(v) for v in files.values()) >= 18 and worst <= 1e-5
    tok = processor.tokenizer
    start, end = tok.convert_tokens_to_ids(["<start_of_turn>", "<end_of_turn>"])
    header = tok.encode("model\n", add_special_tokens=False)
    for n, (messages, images) in enumerate(expected):
        text = processor.apply_chat_template(messages, tokenize=False)      # starts with <bos>: not added again,
        ref = processor(text=[text], images=[images] if images else None,    # as apply_chat_template(tokenize=True)
                        add_special_tokens=False, return_tensors="np", **settings)
        ids, labels = got[f"conv{n}"]
        assert np.array_equal(ids, ref["input_ids"][0]), f"conv{n}"
        assert np.array_equal(ids == tok.image_token_id, ref["token_type_ids"][0] == 1)
        want = chatml_assistant_positions(ref["input_ids"][0], start, end, header)
        assert want.any() and np.array_equal(labels != -100, want), f"conv{n}"
        assert np.array_equal(labels[want], ids[want])


@pytest.mark.parametrize("resample,pas", [(2, False), (3, False), pytest.param(3, True, marks=pytest.mark.slow)])
def test_exact_pixels_equal_the_image_processor_on_resized_jpegs_and_pngs(tmp_path, resample, pas):
    """The folder's resample filter (Gemma 3's bilinear, or bicubic when it says so) on odd-sized JPEGs and
    PNGs, 64 to 1,344 px, through the policy's tiles and the adapter's normalisation; with pan-and-scan, every
    crop (strips that do not divide the side included)."""
    from PIL import Image

    from tests.helpers.image_zoo import save

    folder = gemma3_folder(tmp_path / f"g{resample}", resample=resample, do_pan_and_scan=pas)
    fam, proc = load_family(str(folder)), gemma3_processor(folder)
    settings = {"do_pan_and_scan": True, **PAN_AND_SCAN_DEFAULTS} if pas else {}
    policy = make_policy(fam.vision.policy)
    adapter = make_adapter(ModelSpec.from_family(fam.spec))
    images = dict(sized_jpegs())
    rng = np.random.default_rng(1)
    for w, h in [(333, 501), (1001, 97), (7, 5), (1000, 300), (301, 1201)]:
        images[f"png_{w}x{h}"] = save(Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)), "PNG")
    decoder = ExactDecoder(resample=fam.vision.resample)
    cropped = 0
    for name, data in images.items():
        _, w, h = check_image(data, 1 << 30)
        tiles = decoder.decode([data], [(w, h)], policy)[0]
        assert tiles.shape == (int(policy.tiles(w, h)), 896, 896, 3), name
        cropped += len(tiles) - 1
        got = adapter.normalise(torch.from_numpy(tiles).permute(0, 3, 1, 2), torch.float32)
        assert max_diff(got, hf_pixels(proc.image_processor, data, **settings)["pixel_values"]) <= 1e-5, name
    assert (cropped >= 9) == pas
