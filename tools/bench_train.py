#!/usr/bin/env python3
"""Packed + varlen training against padded batches holding the same real tokens.

Same model, same samples, same run: for each pack produced by VLMDataset, one
training step (forward, backward, AdamW) on the pack as it is (varlen
attention over cu_seqlens), and one on the same samples laid out as rows
padded to the longest sample (one batched SDPA, pad tokens carry no label):
the baseline a trainer without packing runs. The two are interleaved pack by
pack so machine noise hits both alike. Reported: real tokens/s of each and
their ratio (target >= 1.8x on CPU). Unless --no-demo, it then runs the demo
(2 ranks, cache daemon when available) and reports its data-wait fraction
(target < 5 %).

    python tools/bench_train.py [--samples 300] [--packs 10] [--max-tokens 2048] [--out bench_out/bench-train.md]
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import torch  # noqa: E402

from vlmdata.decode import FixedPolicy  # noqa: E402
from vlmdata.testing import write_report  # noqa: E402
from vlmdata_pipelines.demo import DemoConfig, cpu_model, make_corpus, report, run_demo, shard  # noqa: E402
from vlmdata_pipelines.model import TinyVLM, VLMConfig  # noqa: E402
from vlmdata_pipelines.packs import concat_packs, epoch_packs, pad_as_rows, split_pack, spread  # noqa: E402
from vlmdata_pipelines.train import label_count  # noqa: E402


def slot_ratios(packs: list[dict], model_cfg: VLMConfig, pad_id: int) -> tuple[float, float]:
    """Token slots / real tokens of the two padded layouts, without training."""
    real = sum(int(p["cu_seqlens"][-1]) for p in packs)
    shuffled = sum(int(b["cu_seqlens"][-1]) for b in padded_batches(packs, model_cfg, pad_id))
    per_pack = sum(int(p["max_seqlen"]) * len(p["sample_keys"]) for p in packs)
    return shuffled / real, per_pack / real


def timed_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: dict) -> float:
    t = time.perf_counter()
    loss, n = model(batch)
    (loss / max(int(n), 1)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def padded_batches(packs: list[dict], model_cfg: VLMConfig, pad_id: int, seed: int = 0) -> list[dict]:
    """The packs' samples in shuffled order, B per batch (B = mean samples per pack), padded to the longest.

    What a loader without packing feeds: same samples, same real tokens in total.
    """
    samples = [s for p in packs for s in split_pack(p, model_cfg.image_token_id, model_cfg.patch, model_cfg.merge)]
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(seed)).tolist()
    per_batch = max(1, round(len(samples) / len(packs)))
    shuffled = [samples[i] for i in order]
    return [pad_as_rows(concat_packs(shuffled[i:i + per_batch]), pad_id)
            for i in range(0, len(shuffled), per_batch)]


def measure(packs: list[dict], model_cfg: VLMConfig, pad_id: int, warmup: int) -> dict:
    """Train on three layouts of the same samples, interleaved; seconds and slots after warm-up."""
    torch.manual_seed(0)
    model = TinyVLM(model_cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    measured = packs[warmup:]
    layouts = {"packed": measured, "padded": padded_batches(measured, model_cfg, pad_id),
               "padded_per_pack": [pad_as_rows(p, pad_id) for p in measured]}
    labels = {k: sum(label_count(b) for b in v) for k, v in layouts.items()}
    assert len(set(labels.values())) == 1, f"layouts must hold the same label tokens: {labels}"
    for p in packs[:warmup]:
        timed_step(model, opt, p)
        timed_step(model, opt, pad_as_rows(p, pad_id))
    sec = dict.fromkeys(layouts, 0.0)
    names = list(layouts)
    for i in range(max(len(v) for v in layouts.values())):
        for name in names[i % len(names):] + names[:i % len(names)]:  # rotate the order: noise hits all alike
            if i < len(layouts[name]):
                sec[name] += timed_step(model, opt, layouts[name][i])
    real = sum(int(p["cu_seqlens"][-1]) for p in measured)
    slots = {k: sum(int(b["cu_seqlens"][-1]) for b in v) for k, v in layouts.items()}
    return {"real_tokens": real, "slots": slots, "seconds": sec, "batches": {k: len(v) for k, v in layouts.items()},
            "tps": {k: real / sec[k] for k in sec}, "ratio": sec["padded"] / sec["packed"],
            "ratio_per_pack": sec["padded_per_pack"] / sec["packed"], "measured_packs": len(measured)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--packs", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--image-size", type=int, default=56)
    ap.add_argument("--model", default="small", choices=("tiny", "small", "base"))
    ap.add_argument("--corpus", default="raw", choices=("raw", "learnable"))
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the single-process comparison")
    ap.add_argument("--no-demo", action="store_true", help="skip the demo's data-wait measurement")
    ap.add_argument("--demo-steps", type=int, default=30)
    ap.add_argument("--out", default="bench_out/bench-train.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = tempfile.mkdtemp(prefix="bench-train-")
    try:
        cfg = DemoConfig(samples=args.samples, corpus=args.corpus, image_size=args.image_size)
        corpus = make_corpus(cfg, os.path.join(work, "raw"))
        data = os.path.join(work, "ds")
        shard(os.path.join(work, "raw"), data, args.image_size)
        from vlmdata.formats import Manifest
        from vlmdata_pipelines.data import DataOptions, model_fields_for

        fields = model_fields_for(DataOptions(data=data, image_size=args.image_size))
        pad_id = int(Manifest.load(data).tokenizer["special"]["pad"])
        model_cfg = VLMConfig.preset(args.model, attn_backend="reference", **fields)
        epoch = epoch_packs(data, args.max_tokens, FixedPolicy(args.image_size))
        packs = spread(epoch, args.packs + args.warmup)
        res = measure(packs, model_cfg, pad_id, args.warmup)
        res["epoch_packs"] = len(epoch)
        res["epoch_slot_ratios"] = slot_ratios(epoch, model_cfg, pad_id)
        report_lines = describe(args, corpus, model_cfg, res)
        print("\n".join(report_lines), flush=True)
        if not args.no_demo:  # the demo's training, on the same shards
            demo = run_demo(DemoConfig(steps=args.demo_steps, image_size=args.image_size, dataset=data))
            text = report(demo)
            print(text)
            report_lines += ["", "## demo (`vlmdata demo` training defaults, 2 ranks, same shards)", "", "```",
                             text, "```", "",
                             f"**data-wait fraction: {100 * demo.data_wait_fraction:.1f} %** (target < 5 %)"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_report("\n".join(report_lines), args.out)
    return 0


def describe(args: argparse.Namespace, corpus: str, model_cfg: VLMConfig, res: dict) -> list[str]:
    machine = f"{cpu_model()}, {os.cpu_count()} cores"
    versions = f"python {platform.python_version()}, torch {torch.__version__}"
    lines = [
        "# bench-train: packed + varlen vs padded batches (same model, same samples, same run)",
        "",
        f"- command: `{' '.join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:])}`",
        f"- machine: {machine} (load average {os.getloadavg()[0]:.1f} at the end: shared, noisy); {versions}; "
        f"torch threads {args.threads}",
        f"- corpus: {args.samples} samples, {corpus}; max_tokens {args.max_tokens}, images {args.image_size}px "
        f"fixed; model `{args.model}` ({sum(p.numel() for p in TinyVLM(model_cfg).parameters()) / 1e6:.1f} M params)",
        f"- measured: {res['measured_packs']} packs spread evenly over the epoch's {res['epoch_packs']} (after "
        f"{args.warmup} warm-up); the three layouts interleaved step by step (forward, backward, AdamW step each)",
        f"- whole epoch, token slots / real tokens (no training): padded batches "
        f"{res['epoch_slot_ratios'][0]:.2f}, padded per pack {res['epoch_slot_ratios'][1]:.2f}",
        f"- real tokens: {res['real_tokens']} in every layout",
        "",
        "| layout | batches | token slots (% real) | real tokens/s | seconds |",
        "|---|---|---|---|---|",
    ]
    titles = {"packed": "packed + varlen (cu_seqlens)",
              "padded": "padded batches: shuffled samples, B per batch, padded to longest (baseline)",
              "padded_per_pack": "padded per pack: each pack's samples as padded rows (conservative)"}
    for name, title in titles.items():
        slots = res["slots"][name]
        lines.append(f"| {title} | {res['batches'][name]} | {slots} ({100 * res['real_tokens'] / slots:.1f} %) | "
                     f"{res['tps'][name]:,.0f} | {res['seconds'][name]:.2f} |")
    lines += [
        "",
        f"**speed-up vs padded batches: {res['ratio']:.2f}x** (target >= 1.8x); "
        f"vs the conservative per-pack padding: {res['ratio_per_pack']:.2f}x",
    ]
    return lines


if __name__ == "__main__":
    sys.exit(main())
