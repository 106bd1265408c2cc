#!/usr/bin/env python3
"""Sampled-frame video decode: vlmdata's seeking decoder against decoding every frame, in one run.

    python tools/bench_video_decode.py [--seconds 30,60,90,120] [--fps 30] [--gop 60] [--sample-fps 2]
                                       [--size 320x240] [--codec h264|vp9] [--rounds 3] [--site DIR] [--out FILE]

Clips (H.264 in mp4 or VP9 in webm, made once with PyAV and cached under /tmp) of 30-120 s are sampled at
2 frames per second the way Qwen2-VL's video processor counts them (an even number, taken
at evenly spaced positions). Compared on the same clips, in rotated order over `--rounds`:

- `decode-all`: decode every frame and convert every frame to RGB, then pick (what
  `torchvision.io.read_video`-style loaders do);
- `decode-all, convert picked`: PyAV used the straightforward way: decode every frame, convert
  only the picked ones;
- `vlmdata`: `vlmdata.video.decode_frames` with the clip's probed metadata (stored at shard time;
  the probe's own cost is reported on its own line);
- `decord get_batch` (when decord is importable, e.g. from `--site DIR`, a `pip install --target`
  folder): a `VideoReader` on the bytes, `get_batch(indices)`;
- `DALI cpu` (when DALI is installed and its CPU backend decodes the codec: VP9, not H.264):
  `vlmdata.decode.dali.DaliVideoPipeline`, the defer_decode stage's `fn.decoders.video(frames=...)`, one
  clip per run (the pipeline is built before timing). Its frames are DALI's YUV->RGB, not PyAV's.

Every method's frames are checked equal to `decode-all`'s (decord's are reported, not required equal).
Reported: sampled frames per CPU-second (process time, the stable figure on a shared machine)
and per wall second, and each method's ratio to `decode-all`. Target (issue 22): >= 5x.

The cost split, measured on the same clips in the same run, bounds what an exact decoder can reach:
the share of frames that are references (what the decoder outputs with `skip_frame` "NONREF"), the
CPU of decoding every frame, of decoding the references only, and of converting every frame to RGB.
Every reference before a group's last sampled frame must be decoded (vlmdata's decoder outputs just
those and the sampled frames: its `decoded` count), so the ratio cannot exceed decode-all / (those
frames at the references' mean decode cost + converting the sampled frames).
"""
from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import (  # noqa: E402
    ClipSpec,
    make_clip,
    write_report,  # noqa: E402
)
from vlmdata.video import decode_frames, probe_clip  # noqa: E402


def sample_indices(frames: int, fps: float, sample_fps: float, temporal: int = 2) -> list[int]:
    """Evenly spaced frames at `sample_fps`, their count a multiple of `temporal` (Qwen2-VL's rule)."""
    count = int(frames / fps * sample_fps // temporal * temporal)
    count = max(temporal, min(count, frames // temporal * temporal))
    return np.arange(0, frames, frames / count).astype(int).tolist()


CODECS = {"h264": ("libx264", "mp4"), "vp9": ("libvpx-vp9", "webm")}


def clip(seconds: int, args) -> bytes:
    w, h = (int(x) for x in args.size.split("x"))
    encoder, container = CODECS[args.codec]
    suffix = "" if args.codec == "h264" else f"_{args.codec}"
    path = Path("/tmp/vlmdata-bench-video") / f"clip_{seconds}s_{args.fps}fps_g{args.gop}_{w}x{h}{suffix}.{container}"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"encoding {path.name} (once, cached)", flush=True)
        path.write_bytes(make_clip(ClipSpec(container=container, codec=encoder, width=w, height=h, fps=args.fps,
                                            frames=seconds * args.fps, gop=args.gop)))
    return path.read_bytes()


def dali_cpu_method(codec: str):
    """The DALI CPU video pipeline as a method, warmed up (built), or None where it does not apply."""
    from vlmdata.decode import dali_available
    from vlmdata.decode.dali import DALI_VIDEO_CODECS, DaliVideoPipeline, VideoStageOptions

    if not dali_available() or codec not in DALI_VIDEO_CODECS["cpu"]:
        print(f"DALI's CPU backend does not decode {codec} (or DALI is missing): its row is left out", flush=True)
        return None
    pipe = DaliVideoPipeline(VideoStageOptions(device="cpu"))
    pipe.run([np.frombuffer(make_clip(ClipSpec(container="webm", codec=CODECS[codec][0], frames=4)), np.uint8)],
             [np.arange(2)])

    def run(data: bytes, info, indices: list[int]) -> np.ndarray:
        return pipe.run([np.frombuffer(data, np.uint8)], [np.asarray(indices)])[0]

    return run


def decode_pass(data: bytes, skip: str = "DEFAULT", convert: bool = False) -> int:
    """Decode every packet of the clip (with `skip_frame` `skip`), converting each frame when `convert`;
    returns the frames the decoder output."""
    import av

    out = 0
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.video[0]
        stream.thread_type = "NONE"
        stream.codec_context.skip_frame = skip
        for frame in c.decode(stream):
            out += 1
            if convert:
                frame.to_ndarray(format="rgb24")
    return out


def cost_split(clips: dict, infos: dict, picks: dict) -> list[str]:
    """The reference share and the decode / convert CPU of every clip, and the bound they set (see above)."""
    frames = refs = sampled = needed = 0
    cpu = {"decode": 0.0, "decode refs": 0.0, "decode + convert": 0.0}
    for s, data in clips.items():
        frames += infos[s].frames
        sampled += len(picks[s])
        stats = {}
        decode_frames(data, infos[s], picks[s], stats)
        needed += stats["decoded"]
        for name, (skip, convert) in {"decode": ("DEFAULT", False), "decode refs": ("NONREF", False),
                                      "decode + convert": ("DEFAULT", True)}.items():
            t, _, out = timed(decode_pass, data, skip, convert)
            cpu[name] += t
            refs += out if name == "decode refs" else 0
    convert = cpu["decode + convert"] - cpu["decode"]
    floor = cpu["decode refs"] * needed / refs + convert * sampled / frames
    return [f"Cost split ({frames} frames, {sampled} sampled): references {refs / frames:.0%} of the frames; "
            f"decoding every frame {cpu['decode'] * 1000:.0f} ms CPU, the references only "
            f"{cpu['decode refs'] * 1000:.0f} ms, converting every frame to RGB {convert * 1000:.0f} ms "
            f"({convert / cpu['decode + convert']:.0%} of decode-all). Frames an exact decoder must decode "
            f"(references before each group's last sampled frame, and the sampled ones): {needed} "
            f"({needed / frames:.0%}). Bound: decode-all / (those at the references' mean cost + converting "
            f"the sampled frames) = {cpu['decode + convert'] / floor:.2f}x."]


def decode_all(data: bytes, indices: list[int], convert_all: bool) -> list[np.ndarray]:
    import av

    wanted, out = set(indices), {}
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.video[0]
        stream.thread_type = "NONE"
        for i, frame in enumerate(c.decode(stream)):
            if convert_all or i in wanted:
                rgb = frame.to_ndarray(format="rgb24")
                if i in wanted:
                    out[i] = rgb
    return [out[i] for i in indices]


def check_frames(methods: dict, clips: dict, infos: dict, picks: dict) -> set[str]:
    """Run every method once on every clip (untimed: imports, first use) and compare its frames with
    decode-all's; the names of the methods whose frames differ (vlmdata's must not)."""
    differs = set()
    for s, data in clips.items():
        reference = decode_all(data, picks[s], False)
        for name, method in methods.items():
            if not all(np.array_equal(a, b) for a, b in zip(method(data, infos[s], picks[s]), reference)):
                differs.add(name)
    assert "vlmdata" not in differs, "vlmdata's frames differ from decode-all's"
    return differs


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_over_clips(count: int) -> list[tuple[int, float]]:
    """Probe and decode 4 sampled frames of `count` clips (8 distinct 2 s clips in turn); RSS every 10 %."""
    clips = [make_clip(ClipSpec(width=160 + 16 * k, height=96 + 8 * k, frames=60, gop=15), seed=k) for k in range(8)]
    marks = []
    for n in range(count):
        data = clips[n % len(clips)]
        info = probe_clip(data)
        decode_frames(data, info, [3, 20, 37, 55])
        if n % max(count // 10, 1) == 0 or n == count - 1:
            marks.append((n + 1, rss_mib()))
    return marks


def decord_batch(data: bytes, indices: list[int]) -> list[np.ndarray]:
    """decord used the straightforward way: a VideoReader on the bytes, get_batch of the indices."""
    import decord

    reader = decord.VideoReader(io.BytesIO(data), num_threads=1)
    return list(reader.get_batch(indices).asnumpy())


def timed(fn, *args) -> tuple[float, float, object]:
    c0, w0 = time.process_time(), time.perf_counter()
    result = fn(*args)
    return time.process_time() - c0, time.perf_counter() - w0, result


def rotated_rounds(methods: dict, calls: list[tuple], rounds: int) -> dict[str, list]:
    """Each method run on every argument tuple of `calls`, the methods in rotated order over `rounds`:
    name -> [CPU s, wall s, frames returned]."""
    totals = {m: [0.0, 0.0, 0] for m in methods}
    names = list(methods)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            for args in calls:
                cpu, wall, frames = timed(methods[name], *args)
                totals[name][0] += cpu
                totals[name][1] += wall
                totals[name][2] += len(frames)
    return totals


def rate_rows(totals: dict[str, list]) -> list[str]:
    """The report's table: frames per CPU-second and per second, each method's CPU ratio to decode-all."""
    base = totals["decode-all"][2] / totals["decode-all"][0]
    return ["| method | frames / CPU-s | frames / s | vs decode-all (CPU) |", "|---|---:|---:|---:|"] + [
        f"| {name} | {n / cpu:,.0f} | {n / wall:,.0f} | {n / cpu / base:.2f}x |" for name, (cpu, wall, n) in totals.items()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", default="30,60,90,120")
    ap.add_argument("--fps", type=int, default=30)
    ap.add_argument("--gop", type=int, default=60, help="frames between keyframes (x264's default is 250)")
    ap.add_argument("--sample-fps", type=float, default=2.0)
    ap.add_argument("--size", default="320x240")
    ap.add_argument("--codec", default="h264", choices=sorted(CODECS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rss-clips", type=int, default=2000, help="clips for the memory-drift check (0: skip)")
    ap.add_argument("--site", action="append", default=[], help="a folder to import baselines from (decord)")
    ap.add_argument("--out")
    args = ap.parse_args()
    sys.path[1:1] = args.site
    clips = {s: clip(int(s), args) for s in args.seconds.split(",")}
    infos, probe_cpu = {}, 0.0
    for s, data in clips.items():
        cpu, _, infos[s] = timed(probe_clip, data)
        probe_cpu += cpu
    methods = {"decode-all": lambda d, i, idx: decode_all(d, idx, True),
               "decode-all, convert picked": lambda d, i, idx: decode_all(d, idx, False),
               "vlmdata": lambda d, i, idx: decode_frames(d, i, idx)}
    try:
        import decord  # noqa: F401  (optional: a baseline when installed)

        methods["decord get_batch"] = lambda d, i, idx: decord_batch(d, idx)
    except ImportError:
        print("decord is not installed: its baseline is left out", flush=True)
    dali = dali_cpu_method(args.codec)
    if dali is not None:
        methods["DALI cpu"] = dali
    picks = {s: sample_indices(i.frames, i.average_fps, args.sample_fps) for s, i in infos.items()}
    differs = check_frames(methods, clips, infos, picks)
    totals = rotated_rounds(methods, [(data, infos[s], picks[s]) for s, data in clips.items()], args.rounds)
    sampled = sum(len(p) for p in picks.values())
    lines = [f"# Sampled-frame video decode ({args.sample_fps:g} fps sampling)", "",
             f"- machine: {cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
             f"Python {platform.python_version()}, PyAV {__import__('av').__version__}",
             f"- clips: {', '.join(f'{s} s' for s in clips)} of {args.size} {args.codec} at {args.fps} fps, a keyframe every "
             f"{args.gop} frames; {sampled} sampled frames per round, {args.rounds} rounds in rotated order",
             f"- probing all clips (once, at shard time): {probe_cpu * 1000:.0f} ms CPU",
             "- frames equal decode-all's: " + ", ".join(f"{m} {'no' if m in differs else 'yes'}" for m in methods), ""]
    lines += rate_rows(totals) + [""] + cost_split(clips, infos, picks)
    if args.rss_clips:
        marks = rss_over_clips(args.rss_clips)
        warm = marks[1][1] if len(marks) > 1 else marks[0][1]     # after the first 10 %: allocator warmed up
        lines += ["", f"Memory over {args.rss_clips} clips (probe + 4 sampled frames each): RSS "
                      + ", ".join(f"{mib:.0f} MiB after {n}" for n, mib in marks)
                      + f"; last vs after the first 10 %: {(marks[-1][1] / warm - 1) * 100:+.1f} % (target: within 10 %)"]
    text = "\n".join(lines)
    print(text)
    write_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
