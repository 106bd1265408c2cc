"""The Qwen2-VL video policy against independent computations of transformers' Qwen2VLVideoProcessor rules
(its module imports torchvision, which does not import here, so the rules are recomputed: frame indices with
the processor's own `torch.arange(0, total, total / n).int()`, sizes with the Qwen2-VL image processor's
`smart_resize`, the patch layout with the processor's `patchify` view/permute in torch), the vectorised counts
equal to the per-clip ones, and the family's video settings read from the folder."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vlmdata.video import VideoPolicy, flatten_video, make_video_policy

POLICY = VideoPolicy()


def processor_num_frames(total: int, fps: float, p: VideoPolicy) -> int:
    """Qwen2VLVideoProcessor.sample_frames' frame count (transformers 5.x), in plain Python."""
    max_frames = math.floor(min(p.max_frames, total) / p.temporal_patch) * p.temporal_patch
    n = total / fps * p.fps
    n = min(max(n, p.min_frames), max_frames, total)
    return math.floor(n / p.temporal_patch) * p.temporal_patch


def test_frame_indices_follow_the_processors_rule():
    rng = np.random.default_rng(0)
    cases = [(int(f), float(r)) for f, r in zip(rng.integers(2, 20000, 400), rng.choice([8, 23.976, 24, 25, 29.97,
                                                                                            30, 50, 59.94, 60], 400))]
    cases += [(2, 30.0), (3, 10.0), (4, 1.0), (5, 30.0), (1537, 30.0), (100000, 30.0)]
    for p in (POLICY, VideoPolicy(fps=1.0, min_frames=2, max_frames=64), VideoPolicy(fps=4.0, max_frames=16)):
        for total, fps in cases:
            n = processor_num_frames(total, fps, p)
            want = torch.arange(0, total, total / n).int().numpy()
            want = want[want < total]            # an index past the last frame (float32 steps) is dropped
            got = p.frame_indices(total, fps)
            assert np.array_equal(got, want), (total, fps, p)
            assert len(np.unique(got)) == len(got)
            assert int(p.num_frames(total, fps)) == len(want) == n


def test_a_clip_shorter_than_a_temporal_patch_takes_all_its_frames():
    """transformers divides by zero there (n = 0); the policy takes the frame and repeats it."""
    assert POLICY.frame_indices(1, 30.0).tolist() == [0]
    assert POLICY.grid(1, 30.0, 64, 64).tolist() == [1, 24, 24]          # 336 x 336: min_pixels 128 * 28 * 28


def test_frame_sizes_are_smart_resize_with_the_video_bounds():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    rng = np.random.default_rng(1)
    w = rng.integers(16, 4000, 3000)
    h = np.clip((w * np.exp(rng.uniform(-3, 3, 3000))).astype(int), 16, 8000)
    gw, gh = POLICY.frame_size(w, h)
    for i in range(len(w)):
        if max(w[i], h[i]) / min(w[i], h[i]) > 200:
            continue
        assert (int(gh[i]), int(gw[i])) == smart_resize(int(h[i]), int(w[i]), 28, POLICY.min_pixels,
                                                        POLICY.max_pixels)


def test_vectorised_tokens_equal_per_clip_counts():
    rng = np.random.default_rng(2)
    frames, fps = rng.integers(1, 5000, 500), rng.uniform(5, 60, 500)
    w, h = rng.integers(32, 2000, 500), rng.integers(32, 2000, 500)
    tokens = POLICY.tokens(frames, fps, w, h)
    for i in range(0, 500, 7):
        t, gh, gw = POLICY.grid(int(frames[i]), float(fps[i]), int(w[i]), int(h[i])).tolist()
        assert t == -(-len(POLICY.frame_indices(int(frames[i]), float(fps[i]))) // 2)
        assert tokens[i] == t * gh * gw // 4
        n = int(POLICY.num_frames(frames[i], fps[i]))
        assert POLICY.second_per_grid(frames[i], fps[i]) == pytest.approx(2 / (n / frames[i] * fps[i]))


def processor_patchify(frames: np.ndarray, patch: int, merge: int, tp: int) -> np.ndarray:
    """Qwen2VLVideoProcessor.patchify on (n, H, W, 3) frames, with its last-frame padding (torch)."""
    v = torch.from_numpy(frames).permute(0, 3, 1, 2)[None]          # (1, n, C, H, W)
    if pad := -v.shape[1] % tp:
        v = torch.cat((v, v[:, -1:].expand(-1, pad, -1, -1, -1)), dim=1)
    b, n, c, h, w = v.shape
    gt, gh, gw = n // tp, h // patch, w // patch
    x = v.view(b, gt, tp, c, gh // merge, merge, patch, gw // merge, merge, patch).permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return x.reshape(gt * gh * gw, c * tp * patch * patch).numpy()


@pytest.mark.parametrize("n", [1, 2, 3, 6])
def test_patch_rows_are_the_processors_layout(n):
    rng = np.random.default_rng(n)
    frames = rng.integers(0, 256, (n, 56, 84, 3), dtype=np.uint8)
    assert np.array_equal(flatten_video(list(frames), 14, 2, 2), processor_patchify(frames, 14, 2, 2))


def test_policy_dicts_round_trip_and_unknown_kinds_are_refused():
    assert make_video_policy(POLICY.to_dict()) == POLICY
    assert make_video_policy(None) is None
    with pytest.raises(ValueError, match="unknown video policy"):
        make_video_policy({"kind": "uniform", "frames": 8})


def test_the_family_reads_the_folders_video_processor_config(tmp_path):
    import json
    import shutil

    from tests.helpers.models import qwen_folder_or_skip
    from vlmdata.text.families import load_family

    base = qwen_folder_or_skip()
    family = load_family(str(base))
    assert family.encodes_video and family.video_token_id == 151656
    assert make_video_policy(family.vision.video_policy) == VideoPolicy()        # Qwen2-VL's video defaults
    folder = tmp_path / "f"
    shutil.copytree(base, folder)
    (folder / "video_preprocessor_config.json").write_text(json.dumps(
        {"fps": 1.0, "min_frames": 2, "max_frames": 32, "size": {"shortest_edge": 3136, "longest_edge": 50176}}))
    got = make_video_policy(load_family(str(folder)).vision.video_policy)
    assert got == VideoPolicy(fps=1.0, min_frames=2, max_frames=32, min_pixels=3136, max_pixels=50176)


def test_frames_are_resized_as_torchs_uint8_antialiased_bicubic():
    """The processor resizes frame tensors with torchvision, which calls torch's antialiased bicubic
    interpolation; on uint8 frames that equals the policy's Pillow bicubic bit for bit (noise, up and down)."""
    import torch.nn.functional as F

    rng = np.random.default_rng(3)
    p = VideoPolicy(min_pixels=56 * 56, max_pixels=224 * 224)
    for w, h in ((96, 64), (640, 360), (333, 517)):
        frames = list(rng.integers(0, 256, (3, h, w, 3), dtype=np.uint8))
        tw, th = (int(x) for x in p.frame_size(w, h))
        t = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)
        resized = F.interpolate(t, size=(th, tw), mode="bicubic", antialias=True).permute(0, 2, 3, 1).numpy()
        got = p.layout(frames, 1.0)
        assert np.array_equal(got.rows, flatten_video(list(resized), 14, 2, 2)), (w, h)
        assert got.grid == (2, th // 14, tw // 14)
