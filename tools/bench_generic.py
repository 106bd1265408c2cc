#!/usr/bin/env python3
"""The generic family vs a native family for the same model, and the generic planner's token counts.

    python tools/bench_generic.py [--samples 48] [--rounds 3] [--sizes 1000000]

1. Loading. One LLaVA-1.5 folder (vlmdata.testing.llava_folder: its processor loads with AutoProcessor, CLIP's
   PIL image processor) and one corpus of --samples conversations with 1-2 JPEGs of 64-1,344 px are sharded
   twice: with the native `llava` family and with `--family generic`. Both datasets are read to the end
   (exact pixels, 0 workers, one process, a fresh VLMDataset each time: no per-size cache carried over)
   --rounds times, alternating, in the same run; reported: images/s and CPU seconds per image of each (the
   best round) and generic / native of both (target: <= 2; on a loaded machine the CPU ratio is the steadier).
2. Planning. `tokens(w, h)` of the generic policy of a LLaVA-NeXT folder (count rule "nmt": the processor's
   `_get_num_multimodal_tokens`) for --sizes images: all sizes distinct (cold, the processor called once per
   size), then 1,000 distinct sizes repeated (the per-size cache), images/s of each.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from vlmdata import ShardConfig, VLMDataset, shard_dataset  # noqa: E402
from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import llava_folder, llava_next_folder  # noqa: E402
from vlmdata.text.families import load_family  # noqa: E402


def write_rows(out: str, n: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        files = []
        for j in range(int(rng.integers(1, 3))):
            w, h = (int(x) for x in rng.integers(64, 1345, 2))
            arr = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(arr).resize((w, h), Image.Resampling.BILINEAR).save(buf, "JPEG", quality=90)
            name = f"img{i}_{j}.jpg"
            with open(os.path.join(out, name), "wb") as f:
                f.write(buf.getvalue())
            files.append(name)
        content = [{"type": "image"} for _ in files] + [{"type": "text", "text": f"describe picture {i}"}]
        rows.append({"id": f"s{i}", "images": files, "messages": [
            {"role": "user", "content": content},
            {"role": "assistant", "content": [{"type": "text", "text": "a red box on a table"}]}]})
    path = os.path.join(out, "rows.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", type=int, default=1_000_000)
    args = ap.parse_args()
    print(f"machine: {platform.machine()} {cpu_model()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(llava_folder(os.path.join(tmp, "llava")))
        raw = os.path.join(tmp, "raw")
        os.makedirs(raw)
        rows = write_rows(raw, args.samples)
        roots = {}
        for family in ("llava", "generic"):
            roots[family] = os.path.join(tmp, family)
            shard_dataset(ShardConfig(inputs=[rows], output=roots[family], tokenizer=folder, workers=0,
                                      family=None if family == "llava" else family))
        wall = {"llava": math.inf, "generic": math.inf}
        cpu = dict(wall)
        n_images = {}
        for _ in range(args.rounds):
            for family, root in roots.items():
                ds = VLMDataset(root, max_tokens=1 << 15, rank=0, world_size=1)
                assert ds.model_family.name == family
                t0, c0 = time.perf_counter(), time.process_time()
                n_images[family] = sum(p["stats"]["images"] for p in ds)
                wall[family] = min(wall[family], time.perf_counter() - t0)
                cpu[family] = min(cpu[family], time.process_time() - c0)
        for family in wall:
            n = n_images[family]
            print(f"load {family:8s}: {n / wall[family]:8.1f} images/s, {1e3 * cpu[family] / n:6.2f} ms CPU per image "
                  f"({n} images a round)")
        print(f"generic / native: {wall['generic'] / wall['llava']:.2f}x the time, "
              f"{cpu['generic'] / cpu['llava']:.2f}x the CPU (target <= 2); load {os.getloadavg()[0]:.1f}")

        policy = load_family(str(llava_next_folder(os.path.join(tmp, "llava_next")))).vision.image_policy()
        rng = np.random.default_rng(0)
        w = rng.integers(1, 1 << 14, args.sizes)
        h = rng.integers(1, 1 << 14, args.sizes)
        t0 = time.perf_counter()
        policy.tokens(w, h)
        cold = time.perf_counter() - t0
        few_w, few_h = rng.integers(1, 4000, 1000), rng.integers(1, 4000, 1000)
        idx = rng.integers(0, 1000, args.sizes)
        policy.tokens(few_w, few_h)
        t0 = time.perf_counter()
        policy.tokens(few_w[idx], few_h[idx])
        warm = time.perf_counter() - t0
        print(f"planner tokens(), {args.sizes} sizes: all distinct {args.sizes / cold:,.0f} images/s; "
              f"1,000 distinct sizes repeated {args.sizes / warm:,.0f} images/s")


if __name__ == "__main__":
    main()
