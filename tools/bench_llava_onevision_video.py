#!/usr/bin/env python3
"""LLaVA-OneVision videos: vlmdata's path to `pixel_values_videos` against the straightforward one, in one run.

    python tools/bench_llava_onevision_video.py [--seconds 30,60,90,120] [--fps 30] [--gop 60] [--size 320x240]
                                                [--frames 32] [--transcode 448:2] [--rounds 3] [--out FILE]

Clips: H.264 mp4 of 30-120 s (made once with PyAV and cached under /tmp, the clips of
tools/bench_video_decode.py). Each clip becomes the model's `pixel_values_videos` [1, N, 3, 384, 384]
(N = 32 uniformly sampled frames, the published checkpoints' 384 px tile, CLIP mean/std), by:

- `decode-all`: the straightforward baseline. PyAV decodes every frame to RGB (as `torchvision.io.read_video`
  style loaders do), transformers' `LlavaOnevisionVideoProcessor.sample_frames` picks the N frames, and torch
  resizes them (antialiased bicubic on uint8, the processor's torchvision resize) and rescales and normalises them;
- `decode-all, convert sampled`: the same, converting only the sampled frames to RGB (PyAV used with care);
- `vlmdata`: what a DataLoader worker and the training process do: `OnevisionVideoPolicy.load` (the seeking
  decoder on the probed metadata, only the sampled frames decoded, Pillow's bicubic to the tile, uint8 rows),
  then `LlavaOnevisionAdapter.finalize` (normalised and stacked to [videos, N, 3, S, S]);
- `vlmdata, --video-transcode` (with --transcode): the same on the clips as `vlmdata shard --video-transcode`
  stores them (a different, smaller clip: its frames are not the original's, so it has no deviation line); the
  one-off transcode's CPU time is reported on its own line.

All in one process, torch on one thread; the methods take turns in rotated order over --rounds. Reported: clips
and frames per CPU-second (process time, the stable figure on a shared machine) and per wall second, each
method's ratio to `decode-all`, and vlmdata's deviation from the baseline (uint8 levels after the resize).
"""
from __future__ import annotations

import argparse
import importlib
import io
import os
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_video_decode import clip, timed  # noqa: E402

from vlmdata.hf import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, LlavaOnevisionAdapter, ModelSpec  # noqa: E402
from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import write_report  # noqa: E402
from vlmdata.video import OnevisionVideoPolicy, parse_transcode, probe_clip, transcode_clip  # noqa: E402

VIDEO_TOKEN = 151647                 # any id: finalize reads only the spec's video settings


def reference_processor():
    """transformers' LLaVA-OneVision video processor module's class (the package's lazy attribute would ask for
    torchvision; `sample_frames` needs none)."""
    module = importlib.import_module("transformers.models.llava_onevision.video_processing_llava_onevision")
    return module.LlavaOnevisionVideoProcessor()


def decode_all(data: bytes, convert_all: bool, wanted: set[int] | None = None) -> tuple[dict[int, np.ndarray], int]:
    """Every frame decoded with PyAV; all of them converted to RGB, or only `wanted`. Returns (RGB frames by
    index, frame count)."""
    import av

    out, count = {}, 0
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.video[0]
        stream.thread_type = "NONE"
        for i, frame in enumerate(c.decode(stream)):
            count += 1
            if convert_all or i in wanted:
                out[i] = frame.to_ndarray(format="rgb24")
    return out, count


def torch_resized(frames: list[np.ndarray], tile: int) -> torch.Tensor:
    """uint8 [N, 3, S, S]: the processor's resize (torch's antialiased bicubic on uint8 frames)."""
    t = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)
    return torch.nn.functional.interpolate(t, size=(tile, tile), mode="bicubic", antialias=True)


def normalised(resized: torch.Tensor, mean, std) -> torch.Tensor:
    """[1, N, 3, S, S] float32: rescaled to 0-1 and normalised, as the processor returns `pixel_values_videos`."""
    m = torch.tensor(mean).view(1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)
    return ((resized.float() / 255 - m) / s).unsqueeze(0)


class Baseline:
    """Decode every frame, sample with transformers' `sample_frames`, resize and normalise with torch."""

    def __init__(self, policy: OnevisionVideoPolicy, convert_all: bool):
        from transformers.video_utils import VideoMetadata

        self.processor, self.metadata = reference_processor(), VideoMetadata
        self.policy, self.convert_all = policy, convert_all

    def indices(self, frames: int, fps: float) -> list[int]:
        meta = self.metadata(total_num_frames=frames, fps=fps)
        return np.asarray(self.processor.sample_frames(meta, num_frames=self.policy.num_frames)).tolist()

    def resized(self, data: bytes, info) -> torch.Tensor:
        if self.convert_all:
            every, count = decode_all(data, True)
            wanted = self.indices(count, info.average_fps)
        else:          # the frame count from the container, as a careful loader reads it before decoding
            wanted = self.indices(info.frames, info.average_fps)
            every, _ = decode_all(data, False, set(wanted))
        return torch_resized([every[i] for i in wanted], self.policy.tile)

    def __call__(self, data: bytes, info) -> torch.Tensor:
        return normalised(self.resized(data, info), OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)


class Vlmdata:
    """The policy's sampled decode and tiles (a DataLoader worker), then the adapter's finalize."""

    def __init__(self, policy: OnevisionVideoPolicy):
        self.policy = policy
        spec = ModelSpec(family="llava-onevision", image_token_id=VIDEO_TOKEN - 1, image_mean=OPENAI_CLIP_MEAN,
                         image_std=OPENAI_CLIP_STD, patch_size=policy.patch, video_token_id=VIDEO_TOKEN,
                         policy={"kind": "llava_onevision", "image_token_id": VIDEO_TOKEN - 1, "tile": policy.tile})
        self.adapter = LlavaOnevisionAdapter(spec)

    def rows(self, data: bytes, info) -> np.ndarray:
        return self.policy.load(data, info.to_dict()).rows

    def __call__(self, data: bytes, info) -> torch.Tensor:
        video = self.policy.load(data, info.to_dict())
        batch = {"pixel_values_videos": torch.from_numpy(video.rows),
                 "video_frames": torch.tensor([video.grid[0]], dtype=torch.int64)}
        return self.adapter.finalize(batch)["pixel_values_videos"]


def deviation(clips: dict, infos: dict, baseline: Baseline, ours: Vlmdata) -> tuple[float, float]:
    """(max, mean) |vlmdata - baseline| in uint8 levels of the resized frames, over all clips."""
    worst, total, n = 0.0, 0.0, 0
    for s, data in clips.items():
        want = baseline.resized(data, infos[s]).numpy().astype(np.int16)
        got = ours.rows(data, infos[s]).reshape(want.shape).astype(np.int16)
        diff = np.abs(got - want)
        worst, total, n = max(worst, float(diff.max())), total + float(diff.sum()), n + diff.size
    return worst, total / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", default="30,60,90,120")
    ap.add_argument("--fps", type=int, default=30)
    ap.add_argument("--gop", type=int, default=60, help="frames between keyframes (x264's default is 250)")
    ap.add_argument("--size", default="320x240")
    ap.add_argument("--frames", type=int, default=32, help="N, the frames each clip takes")
    ap.add_argument("--transcode", default="448:2", help="SIDE:FPS for the --video-transcode row (off: none)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(1)
    policy = OnevisionVideoPolicy(num_frames=args.frames)
    clips = {s: clip(int(s), args) for s in args.seconds.split(",")}
    infos = {s: probe_clip(data) for s, data in clips.items()}
    inputs = {name: (clips, infos) for name in ("decode-all", "decode-all, convert sampled", "vlmdata")}
    methods = {"decode-all": Baseline(policy, True), "decode-all, convert sampled": Baseline(policy, False),
               "vlmdata": Vlmdata(policy)}
    settings, transcode_cpu = parse_transcode(args.transcode), 0.0
    if settings is not None:
        small = {}
        for s, data in clips.items():
            cpu, _, small[s] = timed(transcode_clip, data, infos[s], settings)
            transcode_cpu += cpu
        name = f"vlmdata, --video-transcode {settings.spec}"
        inputs[name] = (small, {s: probe_clip(d) for s, d in small.items()})
        methods[name] = methods["vlmdata"]
    totals = {m: [0.0, 0.0, 0] for m in methods}
    names = list(methods)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            datas, probes = inputs[name]
            for s, data in datas.items():
                cpu, wall, pixels = timed(methods[name], data, probes[s])
                assert tuple(pixels.shape) == (1, args.frames, 3, policy.tile, policy.tile), pixels.shape
                totals[name][0] += cpu
                totals[name][1] += wall
                totals[name][2] += 1
    worst, mean = deviation(clips, infos, methods["decode-all"], methods["vlmdata"])
    base = totals["decode-all"][2] / totals["decode-all"][0]
    lines = [f"# LLaVA-OneVision video: pixel_values_videos ({args.frames} frames, {policy.tile} px)", "",
             f"- machine: {cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
             f"Python {platform.python_version()}, PyAV {__import__('av').__version__}, torch {torch.__version__} "
             "(1 thread)",
             f"- clips: {', '.join(f'{s} s' for s in clips)} of {args.size} H.264 at {args.fps} fps, a keyframe every "
             f"{args.gop} frames; {args.rounds} rounds in rotated order",
             f"- vlmdata vs decode-all: resized frames differ by at most {worst:.0f} uint8 levels (mean {mean:.3f}): "
             "Pillow's bicubic against torch's"]
    if settings is not None:
        lines.append(f"- transcoding the clips once ({settings.spec}, shard time): {transcode_cpu:.2f} s CPU")
    lines += ["", "| method | clips / CPU-s | frames / CPU-s | clips / s | vs decode-all (CPU) |",
              "|---|---:|---:|---:|---:|"]
    for name, (cpu, wall, n) in totals.items():
        lines.append(f"| {name} | {n / cpu:.2f} | {n * args.frames / cpu:,.0f} | {n / wall:.2f} | "
                     f"{n / cpu / base:.2f}x |")
    text = "\n".join(lines)
    print(text)
    write_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
