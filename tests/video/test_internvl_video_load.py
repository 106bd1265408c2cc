"""Videos sharded with an InternVL3 folder (the Qwen2 byte-level BPE from PyPI with InternVL3's special tokens) and
loaded: each sample's ids and trained positions equal the real `InternVLProcessor`'s on the same messages and
clips, "Frame1: " merged with the text before it where the BPE merges across that boundary; the pack's
`pixel_values` (through the InternVL adapter) are the processor's, clip frames between image tiles in token order.
InternVLVideoProcessor needs torchvision (not installed): the processor is given transformers' PyAV reader at its
`sample_frames` indices and the folder's image processor resize (`tests/helpers/internvl_video.py`)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.internvl_video import internvl_video_processor
from tests.helpers.models import internvl_folder_or_skip, internvl_processor, samples_of
from tests.helpers.qwen_checks import chatml_trained
from tests.video.qwen_video_corpus import (
    assert_bucket_rows_are_fast_pack_samples,
    assert_planned_lengths_are_built,
)
from vlmdata import VLMDataset
from vlmdata.hf import ModelSpec, make_adapter, take_meta
from vlmdata.ingest import ShardConfig, shard_dataset
from vlmdata.testing import ClipSpec, make_clip
from vlmdata.text.families import load_family
from vlmdata.video import make_video_policy, probe_clip

N = 3                                      # frames per clip (the folder's video config)
TILE = 56
CLIPS = {"a.mp4": ClipSpec(frames=30, fps=10, width=64, height=48),
         "b.mp4": ClipSpec(codec="mpeg4", frames=20, fps=25, width=80, height=60)}   # mp4: transformers' PyAV
# reader takes the frame count from the container, which webm does not state


def _user(*items) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": i} if isinstance(i, str) else i for i in items]}


def _reply(text: str) -> dict:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


VIDEO, IMAGE = {"type": "video"}, {"type": "image"}
# (id, messages, images, videos): "and " + "Frame1" is one BPE word in the processor's string ("ĠFrame")
ROWS = [("v_only", [_user(VIDEO, "What happens?"), _reply("A dog runs.")], [], ["a.mp4"]),
        ("v_glued", [_user("Look at this and ", VIDEO, "now?"), _reply("Stripes.")], [], ["b.mp4"]),
        ("mix", [_user(IMAGE, "This and ", VIDEO, " the clip?"), _reply("The same.")], ["wide.png"], ["a.mp4"]),
        ("v_i_v", [_user(VIDEO, IMAGE, "then", VIDEO, "compare"), _reply("Both move.")], ["tall.png"],
         ["b.mp4", "a.mp4"]),
        ("i_only", [_user(IMAGE, "What colour?"), _reply("Green.")], ["wide.png"], []),
        ("t_only", [_user("Say hi."), _reply("Hi.")], [], [])]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("ivl-video")
    folder = root / "internvl"
    shutil.copytree(internvl_folder_or_skip(tile=TILE, max_tiles=4, image_seq_length=4), folder)
    (folder / "video_preprocessor_config.json").write_text(json.dumps(
        {"video_processor_type": "InternVLVideoProcessor", "num_frames": N, "image_mean": [0.485, 0.456, 0.406],
         "image_std": [0.229, 0.224, 0.225], "size": {"height": TILE, "width": TILE}}))
    raw = root / "raw"
    raw.mkdir()
    for name, spec in CLIPS.items():
        (raw / name).write_bytes(make_clip(spec))
    rng = np.random.default_rng(3)
    for name, (w, h) in {"wide.png": (150, 50), "tall.png": (40, 100)}.items():       # 3 tiles + thumbnail, 2 + 1
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(raw / name)
    (raw / "rows.jsonl").write_text("".join(json.dumps({"id": k, "messages": m, "images": i, "videos": v}) + "\n"
                                            for k, m, i, v in ROWS))
    m = shard_dataset(ShardConfig(inputs=[str(raw / "rows.jsonl")], output=str(root / "ds"), tokenizer=str(folder),
                                  workers=0))
    assert m.num_samples == len(ROWS) and not m.stats.get("skipped")
    processor = internvl_video_processor(internvl_processor(folder), N)
    return folder, raw, str(root / "ds"), processor


def _reference(processor, raw, messages, images, videos) -> dict:
    text = processor.apply_chat_template(messages, tokenize=False)
    kw = {"images": [Image.open(raw / f).convert("RGB") for f in images]} if images else {}
    if videos:
        kw["videos"] = [str(raw / f) for f in videos]
    return processor(text=[text], return_tensors="pt", **kw)


def test_sampled_frames_are_the_video_processors(corpus):
    folder, raw, _, processor = corpus
    policy = make_video_policy(load_family(str(folder)).vision.video_policy)
    for name in CLIPS:
        frames = probe_clip((raw / name).read_bytes()).frames
        assert policy.frame_indices(frames).tolist() == processor.video_processor.indices(frames), name


def test_ids_and_trained_positions_equal_the_processors(corpus):
    folder, raw, ds_path, processor = corpus
    got = {}
    for pack in VLMDataset(ds_path, max_tokens=4096):
        got.update(samples_of(pack))
    trained = chatml_trained(processor)
    prefix = load_family(str(folder)).vision.video_policy["prefix_ids"][0]
    for key, messages, images, videos in ROWS:
        ref = _reference(processor, raw, messages, images, videos)["input_ids"][0].numpy()
        ids, labels = got[key]
        assert np.array_equal(ids, ref), key
        assert np.array_equal(labels != -100, trained(ref)) and trained(ref).any(), key
        if key == "v_glued":            # the BPE merged across the boundary: "Frame1: " alone would differ
            first = int(np.flatnonzero(ref == processor.start_image_token_id)[0])
            assert ref[first - len(prefix):first].tolist() != prefix


def test_pixel_values_are_the_processors_in_token_order(corpus):
    _, raw, ds_path, processor = corpus
    ds = VLMDataset(ds_path, max_tokens=4096)
    adapter = make_adapter(ModelSpec.from_dataset(ds))
    rows = {k: (m, i, v) for k, m, i, v in ROWS}
    compared = 0
    for pack in ds:
        host = adapter(pack)
        keys = take_meta(host)["sample_keys"]
        got = adapter.finalize(host).get("pixel_values")
        refs = [_reference(processor, raw, *rows[k]) for k in keys]
        want = [r["pixel_values"] for r in refs if "pixel_values" in r]
        if not want:
            continue
        want = torch.cat(want)
        assert got.shape == want.shape and float((got - want).abs().max()) <= 1e-5
        compared += len(want)
    tiles = sum(len(processor.image_processor([Image.open(raw / f).convert("RGB")], crop_to_patches=True,
                                              return_tensors="pt")["pixel_values"])
                for _, _, images, _ in ROWS for f in images)
    assert compared == tiles + N * sum(len(v) for *_, v in ROWS)        # every image tile and every clip's frames


def test_planned_lengths_are_the_built_ones(corpus):
    assert_planned_lengths_are_built(corpus[2], max_tokens=2048)


def test_the_per_sample_path_expands_videos_as_the_fast_path(corpus):
    assert_bucket_rows_are_fast_pack_samples(corpus[2])
