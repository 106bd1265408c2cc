"""The generic family (issue 21 item 2) against transformers' own processors for two models vlmdata has no
native family for: LLaVA-NeXT (LlavaNextProcessor, LlavaNextImageProcessorPil) and Aya Vision
(AyaVisionProcessor, GotOcr2ImageProcessorPil), each loaded with AutoProcessor from the folder: ids and labels of
the sharded-then-loaded reference corpus, the pack's pixel keys (the processor on the pack's images together),
planned token counts on random sizes, and the refusals (torchvision-only processor, text joining the image marker,
a `--family` that contradicts the folder, a changed or missing folder at load time)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from tests.helpers.models import samples_of, shard_reference_rows
from tests.helpers.sizes import log_uniform_sizes
from vlmdata import VLMDataset
from vlmdata.decode import make_policy
from vlmdata.errors import ConfigError
from vlmdata.hf import ModelSpec, make_adapter, take_meta
from vlmdata.testing import (
    ModelFilesUnavailable,
    aya_vision_folder,
    default_cache,
    llava_folder,
    llava_next_folder,
)
from vlmdata.text.families import FAMILIES, GenericFamily, load_family


def _processor(folder):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def llava_next(tmp_path_factory):
    return llava_next_folder(tmp_path_factory.mktemp("llava_next"))


@pytest.fixture(scope="module")
def aya(tmp_path_factory):
    try:
        return aya_vision_folder(tmp_path_factory.mktemp("aya"), default_cache())
    except ModelFilesUnavailable as exc:
        pytest.skip(f"the Qwen2 tokenizer files (used for the Aya Vision folder) could not be obtained: {exc}")


def test_generic_is_tried_last_and_a_contradicting_family_is_refused(llava_next, tmp_path):
    assert FAMILIES[-1] is GenericFamily
    fam = load_family(str(llava_next))
    assert fam.name == "generic" and fam.vision.policy["kind"] == "processor"
    with pytest.raises(ConfigError, match="--family llava contradicts .*'llava_next'.*generic family"):
        load_family(str(llava_next), family="llava")
    native = llava_folder(tmp_path / "llava")                  # a native family's folder keeps its family ...
    assert load_family(str(native)).name == "llava"
    assert load_family(str(native), family="generic").name == "generic"     # ... and may be forced to generic


@pytest.mark.parametrize("model", ["llava_next", "aya"])
def test_sharded_and_loaded_ids_labels_and_pixels_equal_the_processor(model, request, tmp_path):
    folder = request.getfixturevalue(model)
    proc = _processor(folder)
    rows, expected, data = shard_reference_rows(tmp_path, folder, max_samples_per_shard=4)
    ds = VLMDataset(str(data), max_tokens=1 << 16, rank=0, world_size=1)
    assert ds.model_family.name == "generic" and ds.pixels == "exact"
    adapter = make_adapter(ModelSpec.from_dataset(ds))
    files = {json.loads(line)["id"]: json.loads(line)["images"] for line in rows.read_text().splitlines()}
    got, compared, shapes = {}, 0, set()
    for pack in ds:
        got.update(samples_of(pack))
        host = adapter(pack)
        keys = take_meta(host)["sample_keys"]
        inputs = adapter.finalize(host)
        images = [Image.open(rows.parent / f).convert("RGB") for k in keys for f in files[k]]
        if not images:
            assert "pixel_values" not in inputs
            continue
        ref = proc(text=[proc.image_token * len(images)], images=images, return_tensors="pt")
        want = {k: v for k, v in ref.items() if k not in ("input_ids", "attention_mask")}
        assert set(want) <= set(inputs)
        for k, v in want.items():
            assert inputs[k].shape == v.shape and float((inputs[k].double() - v.double()).abs().max()) <= 1e-5, k
        shapes.add(tuple(want["pixel_values"].shape[1:]))
        compared += len(images)
    assert compared == sum(len(i) for _, i in expected)
    for n, (messages, images) in enumerate(expected):
        out = proc.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                       images=images or None, return_tensors="np")
        ref, mask = out["input_ids"][0], np.asarray(out["assistant_masks"][0]) != 0
        ids, labels = got[f"conv{n}"]
        assert np.array_equal(ids, ref), f"conv{n}"
        assert mask.any() and np.array_equal(labels != -100, mask), f"conv{n}"
        assert np.array_equal(labels[mask], ref[mask])


@pytest.mark.parametrize("model, rule, runs", [("llava_next", "nmt", 200), ("aya", "key", 80)])
def test_planned_token_counts_equal_the_processor(model, rule, runs, request):
    """Counts from stored sizes: 10^4 sizes against the processor's own counting method where the policy uses
    it, and a few hundred against the processor run (on an image of noise, so no blank-image shortcut)."""
    folder = request.getfixturevalue(model)
    proc = _processor(folder)
    policy = load_family(str(folder)).vision.image_policy()
    assert policy.count_rule == rule
    w, h = log_uniform_sizes(10_000, 5, 4000, low=8, max_ratio=100)
    assert len(w) == 10_000 and w.max() > 2000 and w.min() < 16
    got = policy.tokens(w, h)
    if rule == "nmt":
        want = proc._get_num_multimodal_tokens(image_sizes=list(zip(h.tolist(), w.tolist()))).num_image_tokens
        assert np.array_equal(got, np.asarray(want) + policy.count_offset)
    rng = np.random.default_rng(1)
    for a, b in list(zip(w[:runs].tolist(), h[:runs].tolist())) + [(8, 3000), (3000, 8), (1, 1)]:
        noise = Image.fromarray(rng.integers(0, 256, (min(b, 64), min(a, 64), 3), dtype=np.uint8)).resize((a, b))
        ids = proc(text=[proc.image_token], images=[noise], add_special_tokens=False)["input_ids"][0]
        assert int(policy.tokens([a], [b])[0]) == len(ids), (a, b)
        assert np.array_equal(policy.expansion(a, b), ids), (a, b)


def test_a_changed_or_missing_folder_is_refused_at_load_time(llava_next, tmp_path):
    copy = shutil.copytree(llava_next, tmp_path / "model")
    spec = load_family(str(copy)).vision.policy
    assert make_policy(spec).tokens([640], [480])[0] > 0
    cfg = json.loads((copy / "processor_config.json").read_text())
    cfg["image_processor"]["image_grid_pinpoints"] = [[336, 336]]
    (copy / "processor_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="changed since the dataset was sharded .*processor_config.json"):
        make_policy(spec).tokens([640], [480])
    shutil.rmtree(copy)
    with pytest.raises(ConfigError, match="does not exist here"):
        make_policy(spec).expansion(640, 480)


def test_a_processor_that_needs_torchvision_is_a_clear_error(llava_next, tmp_path):
    """Pixtral / Mistral 3's processor requires torchvision, which does not import here."""
    folder = shutil.copytree(llava_next, tmp_path / "mistral3")
    (folder / "config.json").write_text(json.dumps({"model_type": "mistral3"}))
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": "PixtralProcessor",
                                                              "patch_size": 16}))
    (folder / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "PixtralImageProcessor",
                                                                 "size": {"longest_edge": 1024}}))
    with pytest.raises(ConfigError, match="needs torchvision"):
        load_family(str(folder))


def test_a_model_without_an_image_processor_is_a_clear_error(llava_next, tmp_path):
    folder = shutil.copytree(llava_next, tmp_path / "text_only")
    for name in ("preprocessor_config.json", "processor_config.json"):
        (folder / name).unlink(missing_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConfigError, match="cannot load the processor .*preprocessor_config.json"):
        load_family(str(folder))


def test_text_that_joins_the_image_marker_is_refused(aya, tmp_path):
    """An expansion that starts with plain text ("img:") merges with the text before the marker: the
    processor's tokens differ from vlmdata's, and the family says so instead of sharding wrong ids."""
    folder = aya_vision_folder(tmp_path / "joined", default_cache(), start_of_img_token="img:")
    with pytest.raises(ConfigError, match="tokenizes differently"):
        load_family(str(folder))
