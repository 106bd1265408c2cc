#!/usr/bin/env python3
"""Where the loader's time goes, stage by stage, on the JPEG tar path and on the memmap path.

    python tools/profile_loader.py [--samples 1500] [--size 336] [--workers 2] [--paths tar,memmap]
                                   [--rounds 2] [--out bench_out/profile-loader.md]

Part 1, stage costs: the work one DataLoader worker does for a pack, run in this process over
every pack of an epoch (the dataset's own plan: `VLMDataset.planner()` and `rank_packs`), with
a timer around each stage, in the order the dataset runs them:

    fetch     the shard's bytes from the fetcher (`DirectFetcher.get`: read or map, size + CRC32)
    index     the shard's SampleIndex (loaded once per shard)
    slice     the sample's members out of the shard (`Source.reader(...)(i)`: tar member slicing
              and token parsing; memmap: array views)
    decode    the JPEG's DCT-scaled decode (TurboJPEG, the scale `decoder="auto"` picks)
    resize    the resize to S x S and the RGB conversion after it (decode + resize = the
              decoder's `decode_one`, checked to give the same pixels)
    pack      placeholder expansion, labels, position ids and the pixels copied into the pack's buffer
              (`build_pack`: what `prepare_sample` + `collate_pack` did per sample, for the whole pack)
    ipc       handing the pack to the main process: `ForkingPickler.dumps` in the worker
              (moves tensors that are not in shared memory there) plus `pickle.loads` in the
              main process (maps them)

Each stage is reported as CPU milliseconds per image (thread CPU time: stable on a shared
machine) and its share. `--rounds` repeats part 1 and keeps the smaller figure per stage.

Part 2, end to end: the same dataset through `make_loader(num_workers=W)` for a whole epoch:
images/s, and the CPU seconds of the workers and of the main process, so the stage sum of
part 1 can be compared with what the workers really spent.
"""
from __future__ import annotations

import argparse
import os
import pickle
import platform
import resource
import sys
import time
from collections import defaultdict
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from PIL import Image  # noqa: E402

from vlmdata.cache import DirectFetcher  # noqa: E402
from vlmdata.decode import make_decoder, scale_for  # noqa: E402
from vlmdata.loading import (  # noqa: E402
    DatasetOptions,
    VLMDataset,
    build_pack,
    make_loader,
    set_shared_packs,
)
from vlmdata.metrics import StatsDelta  # noqa: E402
from vlmdata.plan import rank_packs  # noqa: E402
from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import bench_corpus, write_report  # noqa: E402

STAGES = ("fetch", "index", "slice", "decode", "resize", "prepare", "collate", "pack", "ipc")


class Clock:
    """Accumulates thread CPU time and wall time per stage."""

    def __init__(self):
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)
        self._stage = None

    def start(self, stage: str) -> None:
        self._stage = stage
        self._c, self._w = time.thread_time(), time.perf_counter()

    def stop(self) -> None:
        self.cpu[self._stage] += time.thread_time() - self._c
        self.wall[self._stage] += time.perf_counter() - self._w


def _turbo_split(decoder, data, width: int, height: int, clock: Clock):
    """The TurboDecoder's work for one JPEG, timed as decode then resize; None if not a plain JPEG."""
    import simplejpeg

    if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    if colorspace not in ("YCbCr", "Gray"):
        return None
    n = scale_for(w, h, width, height, decoder.scales)
    sw, sh = -(-w * n // 8), -(-h * n // 8)
    exact = (sw, sh) == (width, height)
    clock.start("decode")
    arr = simplejpeg.decode_jpeg(data, colorspace="RGB" if exact else "RGBX", min_width=sw, min_height=sh,
                                 strict=True)
    clock.stop()
    clock.start("resize")
    if arr.shape[:2] != (height, width):
        img = Image.frombuffer("RGBX", (arr.shape[1], arr.shape[0]), arr, "raw", "RGBX", 0, 1)
        arr = np.asarray(img.resize((width, height), decoder.resample).convert("RGB"))
    elif arr.shape[2] != 3:
        arr = np.ascontiguousarray(arr[..., :3])
    clock.stop()
    return arr


def profile_stages(root: str, size: int, max_tokens: int, check: int = 20) -> dict:
    """Part 1: one epoch's packs through the worker's stages in this process, timed."""
    ds = VLMDataset(root, seed=0, max_tokens=max_tokens, image_size=size, rank=0, world_size=1,
                    decoder="auto", options=DatasetOptions(window_shards=4))
    set_shared_packs(True)                 # collate as in a DataLoader worker
    try:
        return _stages(ds, DirectFetcher(), make_decoder("auto"), check)
    finally:
        set_shared_packs(None)


def _stages(ds, fetcher, decoder, check: int) -> dict:
    turbo = decoder.name == "turbo"
    clock = Clock()
    readers: dict = {}
    window = None
    images = samples = packs = 0
    checked = 0
    for item in rank_packs(ds.planner(), 0, 1, 0, 0, 1):
        if item.window != window:
            window, readers = item.window, {}
        records = []
        for shard, row in zip(ds.corpus.shard_of(item.samples).tolist(), ds.corpus.local_of(item.samples).tolist()):
            reader = readers.get(shard)
            if reader is None:
                i = ds.corpus.source_of_shard(shard)
                local = shard - int(ds.corpus.shard_base[i])
                src = ds.sources[i]
                clock.start("fetch")
                data = fetcher.get(src.ref(local))
                clock.stop()
                clock.start("index")
                src.index(local)
                clock.stop()
                reader = readers[shard] = src.reader(local, data)
            clock.start("slice")
            records.append(reader(row))
            clock.stop()
        decoded = []
        for rec in records:
            ims = []
            for data, (w, h) in zip(rec.images, rec.sizes):
                if isinstance(data, np.ndarray):              # memmap: already pixels
                    ims.append(data)
                    continue
                tw, th = ds.policy.target_size(w, h)
                arr = _turbo_split(decoder, data, tw, th, clock) if turbo else None
                if arr is None:
                    clock.start("decode")
                    arr = decoder.decode_one(data, tw, th)
                    clock.stop()
                elif checked < check:                          # same pixels as the decoder's own path
                    assert np.array_equal(arr, decoder.decode_one(data, tw, th)), "split decode differs"
                    checked += 1
                ims.append(arr)
            decoded.append(ims)
        clock.start("pack")
        batch = build_pack(records, decoded, ds.collate_config, StatsDelta(), ds.plan_options.mode)
        clock.stop()
        batch["stats"] = {"images": len(batch.get("pixel_values", []))}
        clock.start("ipc")
        got = pickle.loads(ForkingPickler.dumps(batch))
        clock.stop()
        assert got["input_ids"].shape == batch["input_ids"].shape
        del got, batch
        images += sum(len(ims) for ims in decoded)
        samples += len(decoded)
        packs += 1
    return {"cpu": dict(clock.cpu), "wall": dict(clock.wall), "images": images, "samples": samples, "packs": packs,
            "decoder": decoder.name}


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def end_to_end(root: str, size: int, max_tokens: int, workers: int) -> dict:
    """Part 2: a whole epoch through make_loader; images/s and CPU of workers and main."""
    ds = VLMDataset(root, seed=0, max_tokens=max_tokens, image_size=size, rank=0, world_size=1,
                    decoder="auto", options=DatasetOptions(window_shards=4))
    kids0, main0 = _children_cpu(), time.process_time()
    t0 = time.perf_counter()
    it = iter(make_loader(ds, num_workers=workers, pin_memory=False))
    first = next(it)
    t1 = time.perf_counter()
    n0, n = int(first["stats"]["images"]), 0
    for batch in it:
        n += int(batch["stats"]["images"])
    t2 = time.perf_counter()
    del it, first
    main_cpu = time.process_time() - main0
    return {"images": n0 + n, "epoch_s": t2 - t0, "steady_images_per_s": n / (t2 - t1),
            "epoch_images_per_s": (n0 + n) / (t2 - t0), "workers_cpu_s": _children_cpu() - kids0,
            "main_cpu_s": main_cpu}


def report(name: str, root: str, stages: dict, e2e: dict, workers: int) -> list[str]:
    imgs = max(1, stages["images"])
    total = sum(stages["cpu"].values())
    lines = [f"### {name} ({root})", "",
             f"{stages['packs']} packs, {stages['samples']} samples, {stages['images']} images; decoder "
             f"{stages['decoder']}; part 1 in one process, thread CPU time (best of the rounds)", "",
             "| stage | CPU ms per image | share | wall ms per image |", "|---|---|---|---|"]
    for st in STAGES:
        if st in stages["cpu"]:
            c, w = stages["cpu"][st], stages["wall"][st]
            lines.append(f"| {st} | {1000 * c / imgs:.3f} | {100 * c / total:.1f} % | {1000 * w / imgs:.3f} |")
    lines.append(f"| **all stages** | **{1000 * total / imgs:.3f}** | 100 % | "
                 f"{1000 * sum(stages['wall'].values()) / imgs:.3f} |")
    per_cpu = e2e["images"] / max(1e-9, e2e["workers_cpu_s"] + e2e["main_cpu_s"])
    lines += ["", f"Part 2, end to end with {workers} workers: {e2e['epoch_images_per_s']:.0f} images/s over the "
              f"epoch ({e2e['epoch_s']:.1f} s), {e2e['steady_images_per_s']:.0f} images/s after the first pack; "
              f"workers {1000 * e2e['workers_cpu_s'] / e2e['images']:.3f} CPU ms per image, main process "
              f"{1000 * e2e['main_cpu_s'] / e2e['images']:.3f}; {per_cpu:.0f} images per CPU-second "
              f"(stage sum of part 1: {imgs / total:.0f} images per CPU-second).", ""]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1500)
    ap.add_argument("--size", type=int, default=336)
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--paths", default="tar,memmap")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cache", default=os.environ.get("VLMDATA_BENCH_CACHE", "/tmp/vlmdata-bench"))
    ap.add_argument("--out", default="bench_out/profile-loader.md")
    a = ap.parse_args()
    corpus = bench_corpus(a.cache, a.samples, a.size)
    roots = {"tar": corpus.wds, "memmap": corpus.memmap}
    import PIL
    import torch

    lines = ["# Loader profile (tools/profile_loader.py)", "",
             f"Command: `python tools/profile_loader.py {' '.join(sys.argv[1:])}`".replace("  ", " "),
             f"Machine: {cpu_model()}, {os.cpu_count()} cores, load average "
             f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; Python {platform.python_version()}, torch "
             f"{torch.__version__}, PIL {PIL.__version__}, numpy {np.__version__}", ""]
    for path in a.paths.split(","):
        root = roots[path]
        best = None
        for _ in range(a.rounds):
            got = profile_stages(root, a.size, a.max_tokens)
            if best is None:
                best = got
            else:
                for k in got["cpu"]:
                    if got["cpu"][k] < best["cpu"][k]:
                        best["cpu"][k], best["wall"][k] = got["cpu"][k], got["wall"][k]
        e2e = end_to_end(root, a.size, a.max_tokens, a.workers)
        part = report(f"{path} shards, {a.size} px", root, best, e2e, a.workers)
        print("\n".join(part), flush=True)
        lines += part
    text = "\n".join(lines)
    write_report(text, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
