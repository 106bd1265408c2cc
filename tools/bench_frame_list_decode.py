#!/usr/bin/env python3
"""Frame-list decode: vlmdata's sampled-member decode against decoding every frame of the list, in one run.

    python tools/bench_frame_list_decode.py [--frames 300] [--fps 30] [--size 640x360] [--lists 4]
                                            [--rounds 3] [--out FILE]

A frame list (a video given as image files, LLaVA-Video / ShareGPT4Video style) of `--frames` JPEGs
(quality 90, frames of a clip made with `vlmdata.testing.make_clip`) at `--fps` is stored the way
sharding stores it (`vlmdata.ingest.frame_list.prepare_frame_list`: one uncompressed tar member, a
clip's metadata). Qwen2-VL's video policy (`vlmdata.video.VideoPolicy`, 2 fps) picks the frames. The
methods, on the same lists in rotated order over `--rounds`, all from bytes in memory:

- `decode-all`: Pillow opens and converts every frame to RGB, then the picked ones are taken (a
  loader that reads the whole list, then samples);
- `picked files only`: Pillow on the picked files alone, the straightforward way (the floor);
- `vlmdata`: `vlmdata.video.decode_frames` on the stored tar (which reads only the picked members).

Every method's frames are checked equal to decode-all's in an untimed first pass (which also
leaves out one-off costs: Pillow's plugin registry, imports). Reported: sampled frames per CPU-second
(process time, the stable figure on a shared machine) and per wall second, and each ratio to decode-all.
"""
from __future__ import annotations

import argparse
import io
import os
import platform
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from bench_video_decode import rate_rows, rotated_rounds  # noqa: E402

from vlmdata.ingest import FrameList, VideoOptions, prepare_frame_list  # noqa: E402
from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import ClipSpec, make_clip, write_report  # noqa: E402
from vlmdata.video import ClipInfo, VideoPolicy, decode_frames  # noqa: E402


def jpeg_frames(count: int, width: int, height: int, seed: int) -> list[bytes]:
    """`count` frames of a clip made at test time, each saved as a JPEG (quality 90)."""
    import av
    from PIL import Image

    clip = make_clip(ClipSpec(width=width, height=height, frames=count, gop=30), seed=seed)
    files = []
    with av.open(io.BytesIO(clip)) as c:
        for frame in c.decode(video=0):
            buf = io.BytesIO()
            Image.fromarray(frame.to_ndarray(format="rgb24")).save(buf, format="JPEG", quality=90)
            files.append(buf.getvalue())
    return files


def pillow_rgb(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


def decode_all(files: list[bytes], indices) -> list[np.ndarray]:
    frames = [pillow_rgb(f) for f in files]
    return [frames[i] for i in indices]


def picked_only(files: list[bytes], indices) -> list[np.ndarray]:
    return [pillow_rgb(files[i]) for i in indices]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=300, help="frames in each list")
    ap.add_argument("--fps", type=float, default=30.0, help="the lists' frame rate")
    ap.add_argument("--size", default="640x360")
    ap.add_argument("--lists", type=int, default=4, help="distinct frame lists")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    w, h = (int(x) for x in args.size.split("x"))
    lists = [jpeg_frames(args.frames, w, h, seed) for seed in range(args.lists)]
    stored = []
    for files in lists:
        video = prepare_frame_list(FrameList(frames=tuple(range(len(files))), fps=args.fps),
                                   lambda i, files=files: files[i], VideoOptions())
        stored.append((video.data, ClipInfo.from_dict(video.info)))
    policy = VideoPolicy()
    picks = [policy.frame_indices(info.frames, info.measured_fps).tolist() for _, info in stored]
    methods = {"decode-all": lambda k: decode_all(lists[k], picks[k]),
               "picked files only": lambda k: picked_only(lists[k], picks[k]),
               "vlmdata": lambda k: decode_frames(*stored[k], picks[k])}
    for name, method in methods.items():           # once each, untimed: Pillow's plugin registry, imports
        for k in range(len(lists)):
            reference = decode_all(lists[k], picks[k])
            assert all(np.array_equal(a, b) for a, b in zip(method(k), reference)), name
    totals = rotated_rounds(methods, [(k,) for k in range(len(lists))], args.rounds)
    member_kib = np.mean([len(f) for files in lists for f in files]) / 1024
    lines = [f"# Frame-list decode ({len(picks[0])} of {args.frames} frames sampled, Qwen2-VL's video policy)", "",
             f"- machine: {cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
             f"Python {platform.python_version()}, Pillow {__import__('PIL').__version__}",
             f"- {args.lists} lists of {args.frames} {args.size} JPEG frames ({member_kib:.0f} KiB each) at "
             f"{args.fps:g} fps; {args.rounds} rounds in rotated order; every method's frames equal decode-all's",
             "", *rate_rows(totals)]
    text = "\n".join(lines)
    print(text)
    write_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
