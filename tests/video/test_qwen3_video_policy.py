"""Qwen3-VL's video policy against transformers' own Qwen3-VL code (issue 22 item 3): sampled frame indices
(`Qwen3VLVideoProcessor.sample_frames`), frame sizes and patch counts (`smart_resize`,
`get_num_of_video_patches`, with and without `cap_pixels_per_frame`), temporal-patch times
(`Qwen3VLProcessor._calculate_timestamps`), on metadata grids and on clips made at test time; timestamp ids
composed from digit pieces equal the Qwen tokenizer's own, and a tokenizer where they do not compose is refused."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.qwen3_video import ClipMeta, video_processor
from tests.helpers.sizes import log_uniform_sizes
from vlmdata.testing import ClipSpec, make_clip
from vlmdata.video import (
    TIMESTAMP_PIECES,
    Qwen3VideoPolicy,
    make_video_policy,
    patch_timestamps,
    probe_clip,
    stamp_pieces,
    stamp_text,
)

PIECE_IDS = {p: (100 + i,) for i, p in enumerate(TIMESTAMP_PIECES)}
# (video processor settings, the same as policy fields); {} = Qwen3VLVideoProcessor's defaults
CONFIGS = [({}, {}),
           ({"fps": 1.0, "min_frames": 2, "max_frames": 8}, {"fps": 1.0, "min_frames": 2, "max_frames": 8}),
           ({"fps": 4.0, "max_frames": 64, "size": {"shortest_edge": 64 * 64, "longest_edge": 16 * 256 * 256}},
            {"fps": 4.0, "max_frames": 64, "min_pixels": 64 * 64, "max_pixels": 16 * 256 * 256})]
FRAMES = [1, 2, 3, 5, 17, 60, 61, 99, 100, 301, 1000, 2386, 7201]
RATES = [1.0, 8.0, 23.976, 25.0, 30.0, 59.94]


def policy(**fields) -> Qwen3VideoPolicy:
    return Qwen3VideoPolicy(timestamp_pieces=PIECE_IDS, video_token_id=7, vision_start_id=5, vision_end_id=6, **fields)


@pytest.mark.parametrize("config,fields", CONFIGS)
def test_sampled_frames_equal_the_processors(config, fields):
    from transformers.video_utils import VideoMetadata

    ref, pol = video_processor(config), policy(**fields)
    for frames in FRAMES:
        for fps in RATES:
            want = ref.sample_frames(VideoMetadata(total_num_frames=frames, fps=fps), fps=ref.fps)
            got = pol.frame_indices(frames, fps)
            assert got.tolist() == want.tolist(), (frames, fps)


@pytest.mark.parametrize("cap", [False, True])
@pytest.mark.parametrize("config,fields", CONFIGS)
def test_grids_and_patch_counts_equal_the_processors(config, fields, cap):
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

    ref, pol = video_processor({**config, "cap_pixels_per_frame": cap}), policy(cap_pixels_per_frame=cap, **fields)
    ws, hs = log_uniform_sizes(60, seed=3 + cap, top=4000, low=8, max_ratio=150)
    rng = np.random.default_rng(5)
    for w, h, n in zip(ws.tolist(), hs.tolist(), rng.integers(2, 80, len(ws)).tolist()):
        t, gh, gw = pol.grid_of(n, w, h)
        assert t * gh * gw == ref.get_num_of_video_patches(n, h, w), (n, w, h)
        if not cap:
            rh, rw = smart_resize(n, h, w, 2, 32, ref.size["shortest_edge"], ref.size["longest_edge"])
            assert (gh * 16, gw * 16) == (rh, rw)


def test_patch_times_equal_the_processors():
    from transformers.models.qwen3_vl import Qwen3VLProcessor

    pol = policy()
    for frames in FRAMES:
        for fps in RATES:
            idx = pol.frame_indices(frames, fps)
            want = Qwen3VLProcessor._calculate_timestamps(None, idx, fps, 2)
            got = patch_timestamps(idx, fps, 2)
            assert [stamp_text(t) for t in got] == [f"<{t:.1f} seconds>" for t in want]
            assert np.array_equal(got, np.asarray(want))


@pytest.mark.parametrize("spec", [ClipSpec(frames=60, fps=30), ClipSpec(frames=3, fps=10, width=80, height=80),
                                  ClipSpec(frames=250, fps=25, width=160, height=90, gop=25),
                                  ClipSpec(variable_rate=True, frames=40, fps=24, width=64, height=48)])
def test_clips_made_at_test_time_take_the_processors_frames_grid_and_text(spec):
    """The probe's frame count and measured rate give the processor's frames and grid; the decoded layout has
    as many rows as the grid, and its placeholder ids are the processor's text per temporal patch."""
    data = make_clip(spec)
    info = probe_clip(data)
    ref = video_processor({"fps": 3.0, "size": {"shortest_edge": 64 * 64, "longest_edge": 8 * 128 * 128}})
    pol = policy(fps=3.0, min_pixels=64 * 64, max_pixels=8 * 128 * 128)
    idx, grid, meta = ref.sampled(ClipMeta(info.frames, info.measured_fps, info.width, info.height))
    meta.frames_indices = idx
    got = pol.load(data, info.to_dict())
    assert got.grid == tuple(int(x) for x in grid) and got.rows.shape == (int(np.prod(grid)), 3 * 2 * 16 * 16)
    text = processor_video_text(meta, grid)
    assert got.expansion.tolist() == _ids(text)
    assert got.tokens == int(pol.tokens(info.frames, info.measured_fps, info.width, info.height))


def processor_video_text(meta, grid) -> str:
    """Qwen3VLProcessor.replace_video_token's text for one video, with the markers spelled <S>, <E>, <V>."""
    from types import SimpleNamespace

    import torch
    from transformers.models.qwen3_vl import Qwen3VLProcessor

    me = SimpleNamespace(video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
                         vision_start_token="<S>", vision_end_token="<E>", video_token="<V>",
                         _calculate_timestamps=lambda *a: Qwen3VLProcessor._calculate_timestamps(None, *a))
    inputs = {"video_grid_thw": torch.tensor([list(grid)]), "video_metadata": [meta]}
    return Qwen3VLProcessor.replace_video_token(me, inputs, 0)


def _ids(text: str) -> list[int]:
    """The placeholder text in PIECE_IDS and the markers 5 / 6 / 7 (start, end, video)."""
    import re

    out = []
    for tok in re.findall(r"<S>|<E>|<V>|<[0-9.]+ seconds>", text):
        if tok in ("<S>", "<E>", "<V>"):
            out.append({"<S>": 5, "<E>": 6, "<V>": 7}[tok])
        else:
            out += [PIECE_IDS["<"][0]] + [PIECE_IDS[c][0] for c in tok[1:-9]] + list(PIECE_IDS[" seconds>"])
    return out


def test_the_policy_round_trips_through_its_manifest_dict():
    pol = policy(fps=1.5, cap_pixels_per_frame=True)
    assert make_video_policy(pol.to_dict()) == pol
    with pytest.raises(ValueError, match="unknown video policy kind"):
        make_video_policy({"kind": "nope"})


@pytest.mark.slow
def test_timestamp_pieces_of_the_qwen_tokenizer_compose_its_own_ids():
    from tests.helpers.models import qwen3_folder_or_skip
    from vlmdata.text.families import load_family

    fam = load_family(str(qwen3_folder_or_skip()))
    pieces = fam.timestamp_pieces
    assert pieces is not None and fam.encodes_video and fam.vision.video_policy["kind"] == "qwen3_vl_video"
    for t in np.linspace(0, 7200, 97).round(1).tolist() + [0.05, 0.15, 9.95, 99.95]:
        want = fam.tokenizer.encode(stamp_text(t), add_special_tokens=False).ids
        got = pieces["<"] + sum((pieces[c] for c in f"{t:.1f}"), ()) + pieces[" seconds>"]
        assert list(got) == want, t


def test_a_tokenizer_whose_timestamps_do_not_compose_is_refused():
    """One id per distinct text (digits merged): composing pieces cannot give the tokenizer's ids."""
    table: dict[str, int] = {}
    assert stamp_pieces(lambda text: [table.setdefault(text, len(table))]) is None
    assert stamp_pieces(lambda text: [ord(c) for c in text]) is not None      # one id per character composes


def test_a_qwen3_folder_whose_tokenizer_merges_digits_skips_video_rows_counted(tmp_path):
    """A byte-level BPE that groups digits and learned digit merges: the family lays out no videos, and a video
    row sharded with it is counted as video_unsupported (the image-free text row is still written)."""
    import json

    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

    from vlmdata.ingest import ShardConfig, shard_dataset
    from vlmdata.testing import QWEN2_VL_SPECIALS, qwen3_vl_video_folder
    from vlmdata.text.families import load_family

    folder = qwen3_vl_video_folder(tmp_path / "merged-digits")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)      # GPT-2's regex: "12" stays whole
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(["12.3 seconds, 123 frames at 10 11 12 fps: hello"] * 20, trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in QWEN2_VL_SPECIALS])
    tok.save(str(folder / "tokenizer.json"))
    fam = load_family(str(folder))
    assert fam.name == "qwen3_vl" and fam.timestamp_pieces is None and not fam.encodes_video
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw/c.mp4").write_bytes(make_clip(ClipSpec(frames=20)))
    rows = [{"id": "v", "video": "c.mp4", "conversations": [{"from": "human", "value": "<video>\nhello"},
                                                           {"from": "gpt", "value": "hello"}]},
            {"id": "t", "conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "hello"}]}]
    (tmp_path / "raw/data.json").write_text(json.dumps(rows))
    shard_dataset(ShardConfig(inputs=[str(tmp_path / "raw/data.json")], output=str(tmp_path / "ds"),
                              tokenizer=str(folder), workers=0))
    stats = json.loads((tmp_path / "ds/manifest.json").read_text())["stats"]
    assert stats["samples"] == 1 and stats["skipped"] == {"video_unsupported": 1}
    detail = stats["examples"]["video_unsupported"]["detail"]      # the cause, not "no video policy yet"
    assert "does not compose Qwen3-VL's `<t seconds>` timestamps" in detail and "no video policy" not in detail


def test_the_planners_count_is_the_built_expansions_length():
    """`tokens` counts without building; it equals the expansion's length over random clips (two-id suffix)."""
    pol = Qwen3VideoPolicy(timestamp_pieces={**PIECE_IDS, " seconds>": (40, 41)}, video_token_id=7, vision_start_id=5,
                           vision_end_id=6)
    rng = np.random.default_rng(11)
    frames, fps = rng.integers(1, 30 * 900, 200), rng.choice(RATES, 200)
    ws, hs = log_uniform_sizes(200, seed=12, top=2000, low=16, max_ratio=100)
    counted = pol.tokens(frames, fps, ws, hs)
    for i in range(200):
        idx = pol.frame_indices(int(frames[i]), float(fps[i]))
        built = pol.expansion(idx, float(fps[i]), pol.grid_of(len(idx), int(ws[i]), int(hs[i])))
        assert counted[i] == len(built), i
