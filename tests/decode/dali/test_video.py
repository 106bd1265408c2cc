"""defer_decode for videos (issue 22 item 4), on DALI's CPU backend (device_id=None, no GPU).

DALI 2.4's `fn.decoders.video` decodes in-memory VP8/VP9/MJPEG clips on the CPU (H.264, HEVC, AV1 and
MPEG-4 only on the GPU) at chosen frame indices; its YUV->RGB conversion is not PyAV's, so its frames
are compared to PyAV's within a measured tolerance. Packs through `DaliVideoStage` are compared with the
worker path's packs of the same dataset: equal ids, labels, grids and spans; rows equal for the clips
decoded on the CPU (fallback), within the tolerance for the clip DALI decoded.
"""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

pytest.importorskip("nvidia.dali")

from tests.helpers.models import qwen3_folder_or_skip, qwen_folder_or_skip  # noqa: E402
from tests.video.qwen_video_corpus import (  # noqa: E402
    CLIPS_OF,
    QWEN3_VIDEO_CONFIG,
    by_key,
    packs,
    qwen_video_folder,
    shard_corpus,
)
from vlmdata import VLMDataset  # noqa: E402
from vlmdata.decode.dali import DaliVideoPipeline, DaliVideoStage, VideoStageOptions  # noqa: E402
from vlmdata.loading import DatasetOptions  # noqa: E402
from vlmdata.testing import ClipSpec, make_clip  # noqa: E402

# measured on clips made by make_clip (moving gradients that wrap, so sharp colour edges): DALI's frames
# differ from PyAV's rgb24 by ~1-4 levels on average, up to ~70 at the edges (chroma upsampling)
MEAN_LEVELS, MAX_LEVELS = 5.0, 96
SAME_FIELDS = ("input_ids", "labels", "position_ids", "cu_seqlens", "video_grid", "second_per_grid_ts")


def pyav_frames(data: bytes) -> np.ndarray:
    import av

    with av.open(io.BytesIO(data)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


CPU_CLIPS = {"vp9": ClipSpec(container="webm", codec="libvpx-vp9", frames=24, width=64, height=48, fps=10, gop=8),
             "vp8": ClipSpec(container="webm", codec="libvpx", frames=24, width=64, height=48, fps=10, gop=8),
             "vp9 vfr": ClipSpec(container="webm", codec="libvpx-vp9", frames=24, width=64, height=48, fps=24,
                                 variable_rate=True),
             "vp9 mkv rotated": ClipSpec(container="mkv", codec="libvpx-vp9", frames=24, width=64, height=48,
                                         rotation=90),
             "vp8 odd size": ClipSpec(container="webm", codec="libvpx", frames=24, width=66, height=50)}


@pytest.mark.parametrize("name", sorted(CPU_CLIPS))
def test_dali_cpu_decodes_the_chosen_frames_pyav_decodes(name):
    """Chosen indices (unordered, repeated, as OneVision repeats frames of a short clip): DALI's k-th frame
    is PyAV's frame indices[k] (the closest of all of PyAV's frames), unrotated like PyAV's (the policies
    ignore the display matrix, as transformers' reader does), within the YUV->RGB tolerance."""
    data = make_clip(CPU_CLIPS[name])
    ref = pyav_frames(data).astype(np.int16)
    indices = np.array([0, 17, 5, 5, 23, 9], np.int32)
    (got,) = DaliVideoPipeline(VideoStageOptions()).run([np.frombuffer(data, np.uint8)], [indices])
    assert got.shape == (len(indices), *ref.shape[1:]) and got.dtype == np.uint8
    for k, i in enumerate(indices):
        diff = np.abs(got[k].astype(np.int16)[None] - ref)
        assert int(diff.reshape(len(ref), -1).mean(1).argmin()) == i
        assert diff[i].mean() < MEAN_LEVELS and diff[i].max() <= MAX_LEVELS, (k, diff[i].mean(), diff[i].max())


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("dvideo")
    return shard_corpus(str(root), qwen_video_folder(qwen_folder_or_skip(), str(root / "qwen2-vl")))


@pytest.fixture(scope="module")
def qwen3_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("dvideo3")
    folder = qwen_video_folder(qwen3_folder_or_skip(), str(root / "qwen3-vl"), QWEN3_VIDEO_CONFIG,
                               "Qwen3VLVideoProcessor")
    return shard_corpus(str(root), folder)


def deferred(ds_path: str, options: VideoStageOptions | None = None):
    ds = VLMDataset(ds_path, max_tokens=4096, options=DatasetOptions(defer_decode=True))
    stage = DaliVideoStage(ds.collate_config.video_policy, options)
    return stage, [stage(b) for b in ds]


def test_deferred_packs_ship_clip_bytes_and_sampled_frames_not_pixels(dataset):
    ds = VLMDataset(dataset, max_tokens=4096, options=DatasetOptions(defer_decode=True))
    (b,) = list(ds)
    assert "pixel_values_videos" not in b and len(b["video_bytes"]) == 5
    policy = ds.collate_config.video_policy
    counts = b["video_frame_counts"].tolist()
    assert sum(counts) == len(b["video_frames"]) and b["video_counts"].tolist() == [
        len(CLIPS_OF.get(k, [])) for k in b["sample_keys"]]
    worker = by_key(packs(dataset))
    grids = [g for k in b["sample_keys"] for g in worker[k]["grids"]]
    assert b["video_grid"].tolist() == grids
    frames = np.split(b["video_frames"].numpy(), np.cumsum(counts)[:-1])
    for i, raw in enumerate(b["video_info"]):
        info = json.loads(bytes(raw.tobytes()))
        assert frames[i].tolist() == policy.frame_indices(info["frames"], info["measured_fps"]).tolist()
        assert tuple(b["video_sizes"][i].tolist()) == tuple(int(x) for x in policy.frame_size(info["width"],
                                                                                               info["height"]))


@pytest.mark.parametrize("family", ["dataset", pytest.param("qwen3_dataset", marks=pytest.mark.slow)])
def test_a_deferred_pack_through_dali_equals_the_worker_path(family, request):
    """VP9 through DALI (within the tolerance), H.264 / MPEG-4 on the CPU fallback (exactly): ids (Qwen3-VL:
    with its timestamps), labels, grids and spans are the worker path's, and so is every row of the fallback
    clips."""
    ds_path = request.getfixturevalue(family)
    stage, got = deferred(ds_path)
    assert stage.dali_clips == 1 and stage.fallbacks == {"codec": 4}
    ref = packs(ds_path)
    for r, g in zip(ref, got):
        for name in SAME_FIELDS:
            assert np.array_equal(np.asarray(r[name]), np.asarray(g[name])), name
    want, have = by_key(ref), by_key(got)
    for key in CLIPS_OF:
        a, b = want[key]["rows"].astype(np.int16), have[key]["rows"].astype(np.int16)
        assert a.shape == b.shape
        if key == "v_mix":                                   # the VP9 clip: DALI's YUV->RGB
            assert np.abs(a - b).mean() < MEAN_LEVELS and np.abs(a - b).max() <= MAX_LEVELS
        else:
            assert np.array_equal(a, b), key


def test_without_dali_every_clip_falls_back_and_the_pack_is_the_worker_paths(dataset):
    stage, got = deferred(dataset, VideoStageOptions(use_dali=False))
    assert stage.fallbacks == {"no_dali": 5} and stage.dali_clips == 0
    for r, g in zip(packs(dataset), got):
        assert np.array_equal(r["pixel_values_videos"].numpy(), g["pixel_values_videos"].numpy())


def test_a_clip_that_decodes_nowhere_costs_only_its_sample(dataset):
    """The VP9 clip's bytes in the pack are overwritten: DALI fails (counted), the CPU decoder too; its rows
    are zeros of the planned shape, its sample loses its loss and is counted, the others keep theirs."""
    ds = VLMDataset(dataset, max_tokens=4096, options=DatasetOptions(defer_decode=True))
    stage = DaliVideoStage(ds.collate_config.video_policy)
    (b,) = list(ds)
    owners = np.repeat(np.arange(len(b["video_counts"])), b["video_counts"].numpy())
    vp9 = [b["sample_keys"][k] for k in owners].index("v_mix")
    b["video_bytes"][vp9][16:] = 7                         # keeps the EBML header: DALI tries and fails
    labels_before = b["labels"].clone()
    out = stage(b)
    assert stage.fallbacks == {"codec": 4, "dali_failed": 1} and stage.dali_clips == 0
    assert out["bad_samples"] == ["v_mix"] and out["stats"]["skipped"]["undecodable_video"] == 1
    cu, k = out["cu_seqlens"].tolist(), out["sample_keys"].index("v_mix")
    assert (out["labels"][cu[k]:cu[k + 1]] == -100).all()
    keep = np.ones(len(labels_before), bool)
    keep[cu[k]:cu[k + 1]] = False
    assert np.array_equal(out["labels"].numpy()[keep], labels_before.numpy()[keep])
    rows = by_key([out])["v_mix"]["rows"]
    assert rows.shape == by_key(packs(dataset))["v_mix"]["rows"].shape and not rows.any()


def test_the_training_pipelines_stage_decodes_images_then_videos(dataset):
    """`vlmdata_pipelines.data.with_video_stage`: the image stage (DALI CPU here) and then the video stage
    on the same DALI device, for a dataset whose family lays out videos."""
    from vlmdata.decode.dali import DaliGpuStage, GpuStageOptions
    from vlmdata_pipelines.data import with_video_stage

    ds = VLMDataset(dataset, max_tokens=4096, options=DatasetOptions(defer_decode=True))
    stage = with_video_stage(DaliGpuStage(ds.policy, GpuStageOptions(device="cpu", dtype="float32")),
                             ds.collate_config.video_policy)
    (b,) = [stage(p) for p in ds]
    (want,) = deferred(dataset)[1]
    assert "image_bytes" not in b and "video_bytes" not in b and b["pixel_values"].dtype.is_floating_point
    assert np.array_equal(b["pixel_values_videos"].numpy(), want["pixel_values_videos"].numpy())


def test_bucket_mode_defers_too(dataset):
    """Bucket packs (padded rows, no cu_seqlens) carry the same deferred fields; through the stage (no DALI:
    the CPU decoder, exact) they are the worker path's bucket packs."""
    def buckets(defer: bool) -> list[dict]:
        return list(VLMDataset(dataset, max_tokens=4096, options=DatasetOptions(mode="bucket", defer_decode=defer)))

    want, deferred_packs = buckets(False), buckets(True)
    assert any("video_bytes" in b for b in deferred_packs)
    stage = DaliVideoStage(VLMDataset(dataset, max_tokens=4096).collate_config.video_policy,
                           VideoStageOptions(use_dali=False))
    got = [stage(b) for b in deferred_packs]
    assert [b["sample_keys"] for b in got] == [b["sample_keys"] for b in want]
    for w, g in zip(want, got):
        for name in ("input_ids", "labels", "attention_mask", "pixel_values_videos", "video_grid"):
            assert (name in w) == (name in g), name
            if name in w:
                assert np.array_equal(w[name].numpy(), g[name].numpy()), name
