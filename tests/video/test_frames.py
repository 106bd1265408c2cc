"""decode_frames returns exactly the frames a full decode has at those positions, decoding far fewer."""
from __future__ import annotations

import io

import numpy as np
import pytest

from vlmdata.testing import ClipSpec, make_clip
from vlmdata.video import decode_frames, probe_clip

av = pytest.importorskip("av")

SPECS = [ClipSpec(frames=90), ClipSpec(container="webm", codec="libvpx-vp9", frames=75, fps=25),
         ClipSpec(container="mkv", codec="mpeg4", frames=80), ClipSpec(variable_rate=True, frames=70),
         ClipSpec(faststart=True, frames=64, gop=8), ClipSpec(container="mov", rotation=90, frames=40)]


def all_frames(data: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(data)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.container}-{s.codec}-vfr{int(s.variable_rate)}")
def test_sampled_frames_equal_the_full_decode(spec):
    data = make_clip(spec)
    info = probe_clip(data)
    reference = all_frames(data)
    rng = np.random.default_rng(spec.frames)
    picks = [[0], [spec.frames - 1], sorted(rng.choice(spec.frames, 6, replace=False).tolist()),
             rng.choice(spec.frames, 9).tolist(),                 # unsorted, with repeats: order is kept
             list(range(0, spec.frames, 2))]
    for indices in picks:
        got = decode_frames(data, info, indices)
        assert len(got) == len(indices)
        for i, frame in zip(indices, got):
            assert np.array_equal(frame, reference[i]), (spec, i)


def test_sparse_sampling_seeks_instead_of_decoding_everything():
    spec = ClipSpec(frames=300, gop=12)
    data = make_clip(spec)
    info = probe_clip(data)
    stats = {}
    indices = [10, 100, 200, 290]
    got = decode_frames(data, info, indices, stats)
    reference = all_frames(data)
    assert all(np.array_equal(g, reference[i]) for g, i in zip(got, indices))
    assert stats["seeks"] >= 3
    assert stats["decoded"] <= len(indices) * (spec.gop + 4)   # about a GOP per sampled frame, not 300


def test_dense_sampling_decodes_forward_without_seeking():
    data = make_clip(ClipSpec(frames=60, gop=30))
    info = probe_clip(data)
    stats = {}
    decode_frames(data, info, list(range(0, 60, 3)), stats)
    assert stats["seeks"] == 0 and stats["decoded"] <= 60


def test_indices_out_of_range_are_an_error():
    data = make_clip(ClipSpec(frames=10))
    info = probe_clip(data)
    with pytest.raises(IndexError, match=r"\[0, 10\)"):
        decode_frames(data, info, [3, 10])


def test_a_frame_dropped_by_skipping_is_fetched_again(monkeypatch):
    """Skipping unreferenced frames right up to each target drops wanted B-frames: they still come back exact."""
    from vlmdata.video import frames

    monkeypatch.setattr(frames, "SKIP_MARGIN", 0)
    data = make_clip(ClipSpec(frames=90, gop=30))
    info = probe_clip(data)
    reference = all_frames(data)
    indices = list(range(1, 90, 7))
    stats = {}
    got = decode_frames(data, info, indices, stats)
    assert all(np.array_equal(g, reference[i]) for g, i in zip(got, indices))
    assert stats["seeks"] > 3            # more than one seek per keyframe: the dropped frames were re-fetched
