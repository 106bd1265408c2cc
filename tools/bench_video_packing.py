#!/usr/bin/env python3
"""Packing a mixed image + video corpus from its metadata, and a DataLoader worker's memory over many clips.

    python tools/bench_video_packing.py [--samples 200000] [--max-tokens 16384] [--clips 400]
                                        [--out bench_out/bench-video-packing.md]

1. Packing (issue 22 target: >= 98 % real tokens at 16k). Synthetic planning columns: 40 % video samples
   (one clip of 5-60 s, 24-60 fps, 320x240 to 1280x720), 45 % image samples (1-2 images), 15 % text only,
   text lengths 20-800 tokens. Video tokens come from Qwen2-VL's video policy (its defaults: 2 fps,
   4-768 frames, 128-768 x 28 x 28 pixels per frame) over the clip metadata, as `vlmdata shard` writes
   them into planning.npz. The epoch is planned with `max_patches = max_tokens x merge^2` (the family's
   default budget). Reported: the samples the plan keeps (a sample whose vision tokens alone exceed
   the budget is dropped, never cut), packs, the lower bound ceil(real tokens / max_tokens) and the fill,
   real tokens / (packs x max_tokens); the fullest pack's tokens (never above the budget).
2. Worker memory: `--clips` clips (made once, 4-10 s at 30 fps, 320x240) decoded one after another
   through the policy's sampled-frame path (`VideoPolicy.load`, what a worker runs per clip); RSS
   after the first 10 % of the clips and at the end. Target: flat within 10 %.
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

from vlmdata.decode import DynamicPolicy  # noqa: E402
from vlmdata.plan import Corpus, EpochPlanner, PlanOptions  # noqa: E402
from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import ClipSpec, make_clip, write_report  # noqa: E402
from vlmdata.video import VideoPolicy, probe_clip  # noqa: E402

SHARD = 5000


def columns(n: int, seed: int, video: VideoPolicy) -> dict:
    rng = np.random.default_rng(seed)
    kind = rng.choice(3, n, p=[0.40, 0.45, 0.15])                 # 0 video, 1 images, 2 text
    n_images = np.where(kind == 1, rng.integers(1, 3, n), 0).astype(np.int16)
    m = int(n_images.sum())
    width, height = rng.integers(200, 2000, m).astype(np.int32), rng.integers(200, 2000, m).astype(np.int32)
    fps = rng.choice([24.0, 25.0, 29.97, 30.0, 60.0], n)
    frames = (rng.uniform(5, 60, n) * fps).astype(np.int64)
    side = rng.choice(3, n)
    vw, vh = np.choose(side, [320, 640, 1280]), np.choose(side, [240, 360, 720])
    video_tokens = np.where(kind == 0, video.tokens(frames, fps, vw, vh), 0).astype(np.int32)
    return {"text_tokens": rng.integers(20, 800, n).astype(np.int32), "n_images": n_images, "width": width,
            "height": height, "image_start": (np.cumsum(n_images, dtype=np.int64) - n_images),
            "video_tokens": video_tokens}


def packing(n: int, max_tokens: int) -> dict:
    video = VideoPolicy()
    policy = DynamicPolicy(patch=14, merge=2, min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
    cols = columns(n, 0, video)
    sizes = np.full(n // SHARD, SHARD, np.int64)
    corpus = Corpus.build([cols], [sizes])
    opts = PlanOptions(max_tokens=max_tokens, max_images=None, max_patches=max_tokens * 4, window_shards=8)
    planner = EpochPlanner(corpus, policy, opts, seed=0, epoch=0)
    real, packs, fullest, kept = 0, 0, 0, 0
    for k in range(planner.num_windows):
        plan = planner.plan_window(k)
        per_pack = np.add.reduceat(plan.tokens, plan.bounds[:-1]) if len(plan.tokens) else np.zeros(0)
        real += int(plan.tokens.sum())
        kept += len(plan.samples)
        packs += len(plan.bounds) - 1
        fullest = max(fullest, int(per_pack.max()) if len(per_pack) else 0)
    return {"samples": n, "video_samples": int((cols["video_tokens"] > 0).sum()),
            "video_tokens_mean": float(cols["video_tokens"][cols["video_tokens"] > 0].mean()),
            "kept": kept, "packs": packs, "lower_bound": -(-real // max_tokens), "fill": real / (packs * max_tokens),
            "fullest": fullest}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def worker_memory(n_clips: int) -> dict:
    policy = VideoPolicy()
    made = [make_clip(ClipSpec(frames=30 * s, fps=30, width=320, height=240, gop=30)) for s in (4, 7, 10)]
    infos = [probe_clip(d).to_dict() for d in made]
    marks = {}
    for i in range(n_clips):
        got = policy.load(made[i % 3], infos[i % 3])
        del got
        if i + 1 in (max(1, n_clips // 10), n_clips):
            marks[i + 1] = rss_mb()
    first, last = marks[max(1, n_clips // 10)], marks[n_clips]
    return {"clips": n_clips, "rss_first_mb": first, "rss_last_mb": last, "growth": last / first - 1,
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--clips", type=int, default=400)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    p = packing(a.samples - a.samples % SHARD, a.max_tokens)
    w = worker_memory(a.clips)
    lines = [f"# Video packing and worker memory ({platform.node()}, {cpu_model()}, {os.cpu_count()} CPUs)", "",
             f"packing {p['samples']} samples ({p['video_samples']} with a clip, {p['video_tokens_mean']:.0f} video "
             f"tokens each on average) at {a.max_tokens} tokens: {p['kept']} planned, {p['packs']} packs, lower bound "
             f"{p['lower_bound']} (ratio {p['packs'] / p['lower_bound']:.4f}), fill {100 * p['fill']:.2f} % "
             f"(target >= 98 %), fullest pack {p['fullest']} tokens",
             f"worker RSS over {w['clips']} clips: {w['rss_first_mb']:.1f} MB after {max(1, w['clips'] // 10)}, "
             f"{w['rss_last_mb']:.1f} MB at the end ({100 * w['growth']:+.1f} %, target within 10 %); "
             f"peak {w['max_rss_mb']:.0f} MB"]
    print("\n".join(lines))
    write_report("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
