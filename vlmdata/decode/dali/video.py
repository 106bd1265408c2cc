"""DALI video stage: decode a deferred pack's clips in the training process (issue 22 item 4).

With `DatasetOptions(defer_decode=True)` the workers ship each clip encoded, with the frames its
family's policy sampled and their resize target (`video_bytes`, `video_info`, `video_frames`,
`video_frame_counts`, `video_sizes`, `video_counts`: loading.video_pack). `DaliVideoStage(policy)`
decodes exactly those frames with `fn.decoders.video(frames=...)` (DALI 2.x, in-memory streams), then
lays them out with the policy's own `frame_rows` (the processor's resize and patch layout, the code the
workers run), giving the pack the `pixel_values_videos` uint8 rows the worker path gives.

Codecs: DALI's CPU backend decodes VP8, VP9 and MJPEG only; its mixed backend (NVDEC) also H.264,
HEVC, AV1 and MPEG-4 Part 2. A clip DALI cannot take (another codec, a pre-extracted frame list) or
fails on, and every clip when DALI is not installed, is decoded on the CPU by the worker path's
decoder (`video.frames.decode_frames`, PyAV seeking), counted in `fallbacks` by why ("no_dali",
"codec", "dali_failed") and logged once per kind. A clip the CPU decoder rejects too does not fail the
pack: its rows become zeros (the shapes the planner counted stay), its sample loses its loss and is
counted as `undecodable_video` (`decode.dali.bad_samples`).

DALI converts YUV to RGB its own way: the frames differ from PyAV's `to_ndarray("rgb24")` by a few
levels on average and more at sharp colour edges (chroma upsampling); tests/decode/dali/test_video.py
measures it.

`device="cpu"` runs DALI's CPU backend (no GPU: tests); "mixed" decodes on the GPU (NVDEC) and copies
the sampled frames to the host for the layout.
"""
from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from vlmdata.decode.choose import dali_available
from vlmdata.decode.dali.bad_samples import drop_samples
from vlmdata.decode.dali.pipeline import _abandon_inherited
from vlmdata.errors import Skip
from vlmdata.video.probe import ClipInfo

__all__ = ["DALI_VIDEO_CODECS", "DaliVideoPipeline", "DaliVideoStage", "VideoStageOptions", "DEFERRED_VIDEO_FIELDS"]

log = logging.getLogger(__name__)

# probe codec names (FFmpeg's) each DALI backend decodes (DALI 2.4's fn.decoders.video docstring)
DALI_VIDEO_CODECS = {"cpu": frozenset({"vp8", "vp9", "mjpeg"}),
                     "mixed": frozenset({"vp8", "vp9", "mjpeg", "h264", "hevc", "av1", "mpeg4"})}
DEFERRED_VIDEO_FIELDS = ("video_bytes", "video_info", "video_frames", "video_frame_counts", "video_sizes",
                         "video_counts")


@dataclass(frozen=True)
class VideoStageOptions:
    """device: "cpu" or "mixed" (NVDEC); use_dali False: every clip on the CPU decoder (what a missing
    DALI gives); max_batch: clips per DALI run."""

    device: str = "cpu"
    device_id: int | None = None
    num_threads: int = 1
    max_batch: int = 8
    use_dali: bool = True

    def __post_init__(self) -> None:
        if self.device not in DALI_VIDEO_CODECS:
            raise ValueError(f"DALI video device must be 'cpu' or 'mixed', got {self.device!r}")
        if self.device == "mixed" and self.device_id is None:
            raise ValueError("device='mixed' needs a device_id (the CUDA device index)")


class DaliVideoPipeline:
    """One DALI pipeline decoding chosen frames of in-memory clips; built lazily in the process using it."""

    def __init__(self, options: VideoStageOptions):
        self.options = options
        self._pipe = None
        self._pid: int | None = None
        self.runs = 0

    def _pipeline(self):
        if self._pipe is None or self._pid != os.getpid():
            if self._pipe is not None:              # inherited through fork: never shut down here
                _abandon_inherited(self._pipe)
            from nvidia.dali import fn, types
            from nvidia.dali.pipeline import Pipeline

            opt = self.options
            pipe = Pipeline(batch_size=opt.max_batch, num_threads=opt.num_threads,
                            device_id=opt.device_id if opt.device == "mixed" else None,
                            prefetch_queue_depth=1, exec_async=False, exec_pipelined=False)
            with pipe:
                enc = fn.external_source(name="enc", dtype=types.UINT8, ndim=1, no_copy=False)
                frames = fn.external_source(name="frames", dtype=types.INT32, ndim=1)
                pipe.set_outputs(fn.decoders.video(enc, device=opt.device, frames=frames))
            pipe.build()
            self._pipe, self._pid = pipe, os.getpid()
        return self._pipe

    def run(self, clips: list[np.ndarray], frames: list[np.ndarray]) -> list[np.ndarray]:
        """(F, H, W, 3) uint8 host arrays: the frames `frames[i]` of clip i, in that order; RuntimeError when
        DALI fails on any clip of the call (the pipeline is rebuilt for the next one)."""
        pipe = self._pipeline()
        try:
            pipe.feed_input("enc", clips)
            pipe.feed_input("frames", [np.asarray(f, np.int32) for f in frames])
            self.runs += 1
            (out,) = pipe.run()
        except RuntimeError:
            self._pipe = None       # DALI declares the pipeline invalid after an error
            raise
        if self.options.device == "mixed":
            out = out.as_cpu()
        return [np.array(out[i], dtype=np.uint8, copy=True) for i in range(len(clips))]


class DaliVideoStage:
    """Turns a deferred pack's clips into `pixel_values_videos` (see the module docstring)."""

    def __init__(self, policy, options: VideoStageOptions | None = None):
        self.policy = policy
        self.options = options or VideoStageOptions()
        self.dali = self.options.use_dali and dali_available()
        self._pipeline = DaliVideoPipeline(self.options) if self.dali else None
        self.fallbacks: Counter = Counter()   # clips decoded on the CPU instead: "no_dali", "codec", "dali_failed"
        self.skipped: Counter = Counter()
        self.dali_clips = 0

    def __call__(self, batch: dict) -> dict:
        """Replace the deferred video fields by `pixel_values_videos`; a pack without them is returned as is."""
        if "video_bytes" not in batch:
            return batch
        fields = {name: batch.pop(name) for name in DEFERRED_VIDEO_FIELDS}
        clips = [np.asarray(b, np.uint8) for b in fields["video_bytes"]]
        infos = [json.loads(bytes(np.asarray(i, np.uint8))) for i in fields["video_info"]]
        splits = np.cumsum(np.asarray(fields["video_frame_counts"], np.int64))[:-1]
        sampled = np.split(np.asarray(fields["video_frames"], np.int64), splits)
        sizes = np.asarray(fields["video_sizes"], np.int64).reshape(-1, 2)
        layouts = [self._layout(info, frames, size) for info, frames, size in zip(infos, sampled, sizes)]
        decoded = self._decode_dali(clips, infos, layouts)
        rows, bad = [], []
        for i, (clip, info, layout) in enumerate(zip(clips, infos, layouts)):
            if decoded[i] is None:
                decoded[i] = self._decode_cpu(clip, info, layout, i)
            if decoded[i] is None:
                bad.append(i)
                decoded[i] = _zero_frames(info, len(layout.indices))
            rows.append(self.policy.frame_rows(list(decoded[i]), layout))
            decoded[i] = None               # free each clip's frames once its rows exist
        batch["pixel_values_videos"] = torch.from_numpy(np.concatenate(rows))
        if bad:
            owners = np.repeat(np.arange(len(fields["video_counts"])), np.asarray(fields["video_counts"], np.int64))
            samples = sorted({int(owners[i]) for i in bad})
            self.skipped[Skip.UNDECODABLE_VIDEO] += len(samples)
            drop_samples(batch, samples, Skip.UNDECODABLE_VIDEO)
        return batch

    def _layout(self, info: dict, frames: np.ndarray, size: np.ndarray):
        """The policy's layout of the clip, checked against what the worker shipped."""
        layout = self.policy.clip_layout(ClipInfo.from_dict(info))
        if not np.array_equal(layout.indices, frames) or tuple(layout.size) != tuple(int(x) for x in size):
            raise ValueError("the pack's sampled frames / sizes are not this stage's policy's: the stage was built "
                             "with another video policy than the dataset's (use dataset.collate_config.video_policy)")
        return layout

    def _decode_dali(self, clips: list, infos: list[dict], layouts: list) -> list:
        """Per clip: its sampled frames from DALI, or None (not for DALI, or DALI failed; counted)."""
        out: list = [None] * len(clips)
        if not self.dali:
            for i in range(len(clips)):
                self._note("no_dali", i)
            return out
        codecs = DALI_VIDEO_CODECS[self.options.device]
        mine = []
        for i, info in enumerate(infos):
            if info.get("codec") in codecs:
                mine.append(i)
            else:
                self._note("codec", i)
        step = self.options.max_batch
        for start in range(0, len(mine), step):
            part = mine[start:start + step]
            for i, frames in zip(part, self._run(part, clips, layouts)):
                out[i] = frames
        for i in mine:
            if out[i] is None:
                self._note("dali_failed", i)
            else:
                self.dali_clips += 1
        return out

    def _run(self, part: list[int], clips: list, layouts: list) -> list:
        """DALI's frames for clips `part`; a failed call is retried clip by clip (None for a clip that fails)."""
        try:
            return self._pipeline.run([clips[i] for i in part], [layouts[i].indices for i in part])
        except RuntimeError as exc:
            if len(part) == 1:
                log.debug("DALI failed on a clip: %s", str(exc).splitlines()[0] if str(exc) else exc)
                return [None]
            return [got for i in part for got in self._run([i], clips, layouts)]

    def _decode_cpu(self, clip: np.ndarray, info: dict, layout, index: int) -> np.ndarray | None:
        """The clip's sampled frames from the worker path's decoder, or None when it fails too."""
        from vlmdata.video.frames import decode_frames

        try:
            return np.stack(decode_frames(clip.tobytes(), ClipInfo.from_dict(info), layout.indices))
        except Exception as exc:  # PyAV's error classes, ClipProblem: the clip costs only its sample
            log.warning("clip #%d of a pack decodes neither with DALI nor on the CPU: %s", index, exc)
            return None

    def _note(self, why: str, index: int) -> None:
        if not self.fallbacks[why]:
            log.info("DALI video: clips go to the CPU decoder (%s), e.g. clip #%d; counted in `fallbacks`", why, index)
        self.fallbacks[why] += 1


def _zero_frames(info: dict, n: int) -> np.ndarray:
    """n black frames of the clip's stored size (a clip that does not decode keeps its planned shapes)."""
    return np.zeros((max(n, 1), int(info["height"]), int(info["width"]), 3), np.uint8)
