"""Qwen2-VL / Qwen2.5-VL video policy: which frames a clip takes, their size, grid and token count.

The rule is transformers' `Qwen2VLVideoProcessor` (shared by Qwen2.5-VL) with frame sampling on:

- frames: n = floor(min(max(frames / fps * target_fps, min_frames), M, frames) / tp) * tp with
  M = floor(min(max_frames, frames) / tp) * tp; indices = `torch.arange(0, frames, frames / n).int()`
  (the same torch call; for some lengths, e.g. 2386 frames at 8 fps, its float32 steps add an n+1-th
  index equal to `frames`, past the last frame, which transformers' frame readers then fail on or
  misread: the policy drops it and keeps the n frames its count says). A clip with fewer than `tp`
  frames (where transformers divides by zero) takes all its frames;
- frame size: `smart_resize` with the video bounds (`size.shortest_edge` / `longest_edge`) and factor
  patch * merge, from the stored (coded) width and height, as the processor sees frames (no rotation:
  transformers' PyAV reader does not apply the display matrix either);
- grid (t, h, w) = (ceil(n / tp), H / patch, W / patch): the last frame is repeated to fill a temporal
  patch; tokens = t * h * w / merge²;
- Qwen2.5-VL's `second_per_grid_ts` = tp / sampled fps, sampled fps = n / frames * fps.

`fps` is the clip's measured rate (frames / duration, the shard index's `vid_fps`): the planner and the
loader read the same number, so planned and built lengths agree. For a constant-rate clip it equals the
declared rate transformers reads.

`make_video_policy(dict)` builds a family's policy from its manifest dict by its `kind` (`POLICY_KINDS`:
this one, `qwen2_vl_video`, Qwen3-VL's `qwen3_vl_video`, `video.qwen3_policy`, and LLaVA-OneVision's
`llava_onevision_video`, `video.onevision_policy`; InternVL's `internvl_video`, `video.internvl_policy`).

`VideoPolicy.tokens(...)` is vectorised over numpy arrays (the planner counts from index columns);
`clip_layout(clip)` says which frames a clip takes and their size and grid from its metadata (a deferred
decode ships that with the clip); `frame_rows(frames, layout)` lays decoded frames out as Qwen's flattened
patches; `load(data, info)` does both around decoding only the sampled frames, one clip at a time (`DecodedVideo`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from vlmdata.decode.policy import DynamicPolicy
from vlmdata.video.clip_load import load_clip
from vlmdata.video.internvl_policy import InternVLVideoPolicy
from vlmdata.video.layout import ClipLayout, DecodedVideo, flatten_video, resize_frames
from vlmdata.video.onevision_policy import OnevisionVideoPolicy
from vlmdata.video.qwen3_policy import Qwen3VideoPolicy

__all__ = ["POLICY_KINDS", "DecodedVideo", "VideoPolicy", "flatten_video", "make_video_policy", "sample_video_tokens"]

QWEN2_VL_VIDEO = {"fps": 2.0, "min_frames": 4, "max_frames": 768, "min_pixels": 128 * 28 * 28,
                  "max_pixels": 28 * 28 * 768, "temporal_patch": 2}


@dataclass(frozen=True)
class VideoPolicy:
    """Frame sampling and layout of a Qwen2-VL-style video processor (see the module docstring)."""

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    temporal_patch: int = 2
    patch: int = 14
    merge: int = 2
    min_pixels: int = 128 * 28 * 28
    max_pixels: int = 28 * 28 * 768
    resample: int = 3

    def to_dict(self) -> dict:
        return {"kind": "qwen2_vl_video", **asdict(self)}

    def num_frames(self, frames, fps) -> np.ndarray:
        """Frames sampled from clips of `frames` frames at `fps` (vectorised)."""
        total = np.asarray(frames, dtype=np.float64)
        rate = np.maximum(np.asarray(fps, dtype=np.float64), 1e-9)
        tp = self.temporal_patch
        cap = np.floor(np.minimum(self.max_frames, total) / tp) * tp
        n = np.minimum(np.minimum(np.maximum(total / rate * self.fps, self.min_frames), cap), total)
        n = np.floor(n / tp) * tp
        return np.where(n >= 1, n, total).astype(np.int64)

    def frame_indices(self, frames: int, fps: float) -> np.ndarray:
        """The positions (presentation order) of the frames a clip takes, as the processor picks them."""
        import torch

        n = int(self.num_frames(frames, fps))
        picked = torch.arange(0, frames, frames / n).int().numpy().astype(np.int64)   # the processor's own op
        return picked[picked < frames]            # its float32 steps can add an index `frames`, past the end

    def frame_size(self, width, height) -> tuple[np.ndarray, np.ndarray]:
        """(width, height) each frame is resized to: smart_resize with the video bounds (vectorised)."""
        return DynamicPolicy(self.patch, self.merge, self.min_pixels, self.max_pixels)._sizes(width, height)

    def grid(self, frames, fps, width, height) -> np.ndarray:
        """int64 [..., 3] patch grid (t, h, w) per clip."""
        n = self.num_frames(frames, fps)
        w, h = self.frame_size(width, height)
        t = -(-n // self.temporal_patch)
        return np.stack(np.broadcast_arrays(t, h // self.patch, w // self.patch), axis=-1)

    def tokens(self, frames, fps, width, height) -> np.ndarray:
        """LLM tokens per clip: t * h * w / merge² (vectorised over numpy arrays)."""
        g = self.grid(frames, fps, width, height)
        return g[..., 0] * g[..., 1] * g[..., 2] // (self.merge * self.merge)

    def second_per_grid(self, frames, fps) -> np.ndarray:
        """Seconds one temporal patch spans: temporal_patch / (sampled frames / frames * fps)."""
        n = self.num_frames(frames, fps)
        return self.temporal_patch / (n / np.asarray(frames, np.float64) * np.asarray(fps, np.float64))

    def clip_layout(self, clip) -> ClipLayout:
        """The frames a probed clip (`ClipInfo`) takes, their size and grid, from its metadata."""
        indices = self.frame_indices(clip.frames, clip.measured_fps)
        return self._layout(indices, clip.width, clip.height,
                            float(self.second_per_grid(clip.frames, clip.measured_fps)))

    def _layout(self, indices: np.ndarray, width: int, height: int, second_per_grid: float) -> ClipLayout:
        w, h = (int(x) for x in self.frame_size(width, height))
        t = -(-len(indices) // self.temporal_patch)
        return ClipLayout(indices, (w, h), (t, h // self.patch, w // self.patch), second_per_grid, self.merge)

    def frame_rows(self, frames: list[np.ndarray], layout: ClipLayout) -> np.ndarray:
        """The sampled (H, W, 3) uint8 frames resized (bicubic, as the processor) and flattened."""
        return flatten_video(resize_frames(frames, *layout.size, self.resample), self.patch, self.merge,
                             self.temporal_patch)

    def layout(self, frames: list[np.ndarray], second_per_grid: float) -> DecodedVideo:
        """Resize the sampled (H, W, 3) uint8 frames (bicubic, as the processor) and flatten them."""
        h0, w0 = frames[0].shape[:2]
        layout = self._layout(np.arange(len(frames)), w0, h0, float(second_per_grid))
        return layout.with_rows(self.frame_rows(frames, layout))

    def load(self, data, info: dict) -> DecodedVideo:
        """Decode only the sampled frames of a stored clip (`StoredVideo.data`, its probe dict) and lay
        them out; ClipProblem / ValueError for a clip that does not decode."""
        return load_clip(self, data, info)


# a policy dict's `kind` -> what builds the policy from the rest of the dict
POLICY_KINDS = {"qwen2_vl_video": lambda d: VideoPolicy(**d), "qwen3_vl_video": Qwen3VideoPolicy.from_dict,
                "llava_onevision_video": lambda d: OnevisionVideoPolicy(**d),
                "internvl_video": InternVLVideoPolicy.from_dict}


def make_video_policy(spec: dict | None):
    """The policy a family's `VisionSpec.video_policy` dict describes (None: the family has none)."""
    if not spec:
        return None
    d = dict(spec)
    kind = d.pop("kind", None)
    if kind not in POLICY_KINDS:
        raise ValueError(f"unknown video policy kind {kind!r} (known: {sorted(POLICY_KINDS)})")
    return POLICY_KINDS[kind](d)


def sample_video_tokens(videos, policy) -> np.ndarray:
    """int64 per sample: the tokens of its clips, from a shard index's `VideoColumns` (no decode)."""
    n = len(videos.n_videos)
    if policy is None or not videos.total:
        return np.zeros(n, np.int64)
    per = policy.tokens(videos.vid_frames, videos.vid_fps, videos.vid_width, videos.vid_height)
    owner = np.repeat(np.arange(n), videos.n_videos.astype(np.int64))
    return np.bincount(owner, weights=per, minlength=n).astype(np.int64)
