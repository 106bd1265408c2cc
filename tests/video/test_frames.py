"""decode_frames returns exactly the frames a full decode has at those positions, decoding far fewer."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from vlmdata.testing import ClipSpec, make_clip
from vlmdata.video import ClipInfo, decode_frames, decode_window, probe_clip

av = pytest.importorskip("av")

OPEN_GOP_X264 = (("x264-params", "open-gop=1"),)
MPEG4_B_FRAMES = (("bf", "2"),)
# x264 and x265 use B-frames with a b-pyramid by default (reference B-frames between unreferenced ones);
# x265's groups are open by default (CRA keyframes with leading pictures), as are mpeg4's with B-frames.
SPECS = [ClipSpec(frames=90), ClipSpec(frames=90, gop=30, encoder_options=OPEN_GOP_X264),
         ClipSpec(codec="libx265", frames=90, gop=30), ClipSpec(container="mkv", codec="libx265", frames=60, gop=20),
         ClipSpec(container="webm", codec="libvpx-vp9", frames=75, fps=25),
         ClipSpec(container="mkv", codec="mpeg4", frames=80),
         ClipSpec(container="mkv", codec="mpeg4", frames=80, gop=20, encoder_options=MPEG4_B_FRAMES),
         ClipSpec(variable_rate=True, frames=70),
         ClipSpec(faststart=True, frames=64, gop=8), ClipSpec(container="mov", rotation=90, frames=40)]
OPEN_GOP_SPECS = [s for s in SPECS if s.codec == "libx265" or s.encoder_options]


def spec_id(spec: ClipSpec) -> str:
    options = "-".join(f"{k}={v}" for k, v in spec.encoder_options)
    return f"{spec.container}-{spec.codec}-g{spec.gop}-vfr{int(spec.variable_rate)}{'-' + options if options else ''}"


def all_frames(data: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(data)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def encoder_available(spec: ClipSpec) -> bool:
    try:
        av.codec.Codec(spec.codec, "w")
    except Exception:  # noqa: BLE001  (FFmpeg builds without an encoder raise UnknownCodecError)
        return False
    return True


def made(spec: ClipSpec) -> bytes:
    if not encoder_available(spec):
        pytest.skip(f"this FFmpeg build has no {spec.codec} encoder")
    return make_clip(spec)


def leading_pictures(data: bytes) -> list[int]:
    """Presentation-order pts of the frames demuxed after a keyframe but shown before it (open groups)."""
    with av.open(io.BytesIO(data)) as c:
        packets = [(p.pts, p.is_keyframe) for p in c.demux(video=0) if p.size]
    leading, key_pts = [], None
    for pts, is_key in packets:
        if is_key:
            key_pts = pts
        elif key_pts is not None and pts < key_pts:
            leading.append(pts)
    return leading


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_sampled_frames_equal_the_full_decode(spec):
    data = made(spec)
    info = probe_clip(data)
    reference = all_frames(data)
    assert len(reference) == info.frames
    rng = np.random.default_rng(spec.frames)
    picks = [[0], [spec.frames - 1], sorted(rng.choice(spec.frames, 6, replace=False).tolist()),
             rng.choice(spec.frames, 9).tolist(),                 # unsorted, with repeats: order is kept
             list(range(0, spec.frames, 2)), list(range(1, spec.frames, 15)),
             [int(k) - 1 for k in info.keyframes[1:]]]            # the last frame shown before each keyframe
    for indices in picks:
        stats = {}
        got = decode_frames(data, info, indices, stats)
        assert len(got) == len(indices)
        for i, frame in zip(indices, got):
            assert np.array_equal(frame, reference[i]), (spec, i)
        assert stats["retries"] == 0            # each frame came out of the first, skipping, pass


@pytest.mark.parametrize("spec", OPEN_GOP_SPECS, ids=spec_id)
def test_leading_pictures_of_open_groups_are_exact(spec):
    """A frame shown before a keyframe but decoded after it refers to the group before: it still comes out exact."""
    data = made(spec)
    info = probe_clip(data)
    leading = [info.frame_pts.tolist().index(p - info.start_pts) for p in leading_pictures(data)]
    assert leading, "the clip should have open groups"
    reference = all_frames(data)
    for indices in [[i] for i in leading] + [leading, [i + 1 for i in leading if i + 1 < info.frames]]:
        stats = {}
        got = decode_frames(data, info, indices, stats)
        assert all(np.array_equal(g, reference[i]) for g, i in zip(got, indices)), (spec, indices)
        assert stats["retries"] == 0


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


def test_unreferenced_and_trailing_frames_are_not_decoded():
    """At 2 fps of a 30 fps H.264 clip, the decoder outputs at most the reference frames plus the sampled ones,
    and packets after a group's last sampled frame are not even sent."""
    data = make_clip(ClipSpec(frames=120, gop=60))
    info = probe_clip(data)
    with av.open(io.BytesIO(data)) as c:                 # the reference decoder's own count of reference frames
        c.streams.video[0].thread_type = "NONE"
        c.streams.video[0].codec_context.skip_frame = "NONREF"
        references = sum(1 for _ in c.decode(video=0))
    indices = list(range(0, 105, 15))
    stats = {}
    got = decode_frames(data, info, indices, stats)
    reference = all_frames(data)
    assert all(np.array_equal(g, reference[i]) for g, i in zip(got, indices))
    assert references < info.frames
    assert stats["decoded"] <= references + len(indices) and stats["decoded"] < info.frames
    assert stats["sent"] < info.frames and stats["seeks"] == 0


def test_a_wanted_frame_that_does_not_come_out_is_decoded_again_in_full(monkeypatch):
    """Should the skipping pass lose a wanted frame, its group is decoded again in full: the frames stay exact."""
    from vlmdata.video import frames

    run = frames._run

    def lossy_first_pass(reader, segment):       # every skipping pass drops all unreferenced frames, wanted ones too
        if not segment.full:
            reader.decode = lambda packet, skip_unreferenced: frames._Reader.decode(reader, packet, True)
        try:
            run(reader, segment)
        finally:
            vars(reader).pop("decode", None)

    monkeypatch.setattr(frames, "_run", lossy_first_pass)
    data = make_clip(ClipSpec(frames=90, gop=30))
    info = probe_clip(data)
    reference = all_frames(data)
    with av.open(io.BytesIO(data)) as c:                 # the frames no other frame refers to
        c.streams.video[0].codec_context.skip_frame = "NONREF"
        kept = {f.pts - info.start_pts for f in c.decode(video=0)}
    unreferenced = [i for i, p in enumerate(info.frame_pts.tolist()) if p not in kept]
    indices = [min(i for i in unreferenced if i >= g) for g in (0, 30, 60)]   # one in each group
    stats, windowed = {}, {}
    got = decode_frames(data, info, indices, stats)
    assert all(np.array_equal(g, reference[i]) for g, i in zip(got, indices))
    assert stats["retries"] == len(indices)      # each was lost by the first pass and decoded again
    got = decode_frames(data, decode_window(info, indices), indices, windowed)
    assert all(np.array_equal(g, reference[i]) for g, i in zip(got, indices)) and windowed == stats


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_a_decode_window_decodes_as_the_whole_probe(spec):
    """`decode_window(info, indices)`, what a deferred pack ships, gives decode_frames the same frames and the
    same work (frames decoded, packets sent, seeks, retries) as the whole probe, leading pictures of open
    groups included."""
    data = made(spec)
    info = probe_clip(data)
    rng = np.random.default_rng(spec.frames)
    leading = [info.frame_pts.tolist().index(p - info.start_pts) for p in leading_pictures(data)]
    picks = [[0], [spec.frames - 1], rng.choice(spec.frames, 9).tolist(), list(range(1, spec.frames, 15)),
             [int(k) - 1 for k in info.keyframes[1:]]] + ([leading[:1], leading] if leading else [])
    for indices in picks:
        window = decode_window(info, indices)
        assert window.pts_frames is not None and len(window.frame_pts) <= info.frames
        whole, windowed = {}, {}
        expected = decode_frames(data, info, indices, whole)
        got = decode_frames(data, ClipInfo.from_dict(json.loads(json.dumps(window.to_dict()))), indices, windowed)
        assert all(np.array_equal(g, e) for g, e in zip(got, expected)), (spec, indices)
        assert windowed == whole


def test_the_decode_window_of_a_long_clip_is_bounded_by_the_sampled_frames():
    """A 1200-frame clip sampled at a few frames ships the times of those and a few keyframes around each, not of
    every frame;
    deferred packs carry it (`defer_videos`), and its frames decode as from the whole probe."""
    import vlmdata.formats.sample as stored  # SampleRecord: what the loader reads (not public)
    from vlmdata.formats import StoredVideo
    from vlmdata.loading import defer_videos
    from vlmdata.metrics import StatsDelta
    from vlmdata.video import VideoPolicy

    spec = ClipSpec(width=32, height=32, frames=1200, fps=30, gop=12)
    data = make_clip(spec)
    info = probe_clip(data)
    policy = VideoPolicy(fps=0.2, max_frames=8)
    record = stored.SampleRecord("k", np.zeros((2, 1), np.int32), [], [], videos=[StoredVideo(data, info.to_dict())])
    ((pending,),) = defer_videos([record], policy, StatsDelta())
    indices = pending.layout.indices
    assert 2 <= len(indices) <= 8
    shipped = ClipInfo.from_dict(pending.info)
    assert len(shipped.frame_pts) <= 1 + len(indices) * 7       # frame 0; each frame and six keyframes around it
    assert len(shipped.keyframes) <= len(indices) * 6 < len(info.keyframes)
    assert len(json.dumps(pending.info)) * 5 < len(json.dumps(info.to_dict()))
    assert all(np.array_equal(g, e) for g, e in zip(decode_frames(data, shipped, indices),
                                                     decode_frames(data, info, indices)))
