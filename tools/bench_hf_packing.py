#!/usr/bin/env python3
"""Packed vs padded batches holding the same tokens, on a tiny Hugging Face Qwen2-VL.

Same model (`Qwen2VLForConditionalGeneration` from a config, randomly
initialised, fp32 on CPU), same samples, same run. For each pack VLMDataset
produces (dynamic resolution at the model's own image policy), one training
step (forward, backward, AdamW) in each layout:

- packed: the pack through `vlmdata.hf`'s Qwen adapter: [1, T] ids, M-RoPE
  positions per sample, and the sample boundaries as `cu_seq_lens_*`, read by
  the packed attention `vlmdata.hf.load_model` picks (flash-attention 2 on a GPU
  that has it; here "vlmdata_varlen": one SDPA per sample); `--attn sdpa` runs
  the pack with the 4-D block-diagonal mask instead;
- padded: the samples shuffled and laid out B per batch (B = mean samples per
  pack) as rows padded to the longest, with a 2-D attention_mask, on
  transformers' own sdpa (its padded path; what a trainer without packing feeds);
- padded per pack: each pack's own samples as padded rows (a conservative
  baseline: samples of one pack are already similar in number of tokens).

Steps are interleaved layout by layout (rotating the order) so machine noise
hits all alike. Reported: real tokens/s of each and the ratio (target >= 1.8x).

    python tools/bench_hf_packing.py [--samples 200] [--packs 10] [--max-tokens 2048] [--out bench_out/bench-hf-packing.md]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import torch  # noqa: E402

from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import write_report  # noqa: E402
from vlmdata_pipelines.demo import DemoConfig, make_corpus, shard  # noqa: E402
from vlmdata_pipelines.packs import concat_packs, epoch_packs, padded_rows, split_pack, spread  # noqa: E402

MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]


def write_model_folder(path: str, vocab_size: int, image_token_id: int, hidden: int, layers: int,
                       max_pixels: int) -> str:
    """A tiny Qwen2-VL folder whose ids fit the dataset's tokenizer (config.json + preprocessor_config.json)."""
    from transformers import Qwen2VLConfig

    heads = max(hidden // 64, 2)
    half = hidden // heads // 2                       # rotary pairs per head, split over (t, h, w) as Qwen does
    section = [half // 4, 3 * half // 8, half - half // 4 - 3 * half // 8]
    vocab = 64 * -(-(vocab_size + 4) // 64)
    Qwen2VLConfig(
        text_config=dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=32768,
                         rope_parameters={"rope_type": "default", "mrope_section": section, "rope_theta": 10000.0},
                         bos_token_id=None, eos_token_id=None, pad_token_id=None),
        vision_config=dict(depth=2, embed_dim=64, hidden_size=hidden, num_heads=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, mlp_ratio=2),
        image_token_id=image_token_id, video_token_id=vocab - 1, vision_start_token_id=vocab - 2,
        vision_end_token_id=vocab - 3,
    ).save_pretrained(path)
    pre = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 56 * 56,
           "max_pixels": max_pixels, "image_mean": MEAN, "image_std": STD}
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump(pre, f)
    return path


def shuffled_padded(packs: list[dict], spec, pad_id: int, seed: int = 0) -> list[dict]:
    """The packs' samples shuffled, B per batch (B = mean samples per pack), as padded rows."""
    samples = [s for p in packs for s in split_pack(p, spec.image_token_id, spec.patch_size, spec.merge_size)]
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(seed)).tolist()
    per_batch = max(1, round(len(samples) / len(packs)))
    shuffled = [samples[i] for i in order]
    return [padded_rows(concat_packs(shuffled[i:i + per_batch]), pad_id) for i in range(0, len(shuffled), per_batch)]


def label_tokens(batch: dict) -> int:
    labels = batch["labels"]
    return int((labels[..., 1:] != -100).sum())


def timed_step(model, opt, adapter, batch: dict) -> float:
    if model.config.get_text_config()._attn_implementation != adapter.attn_implementation:
        model.set_attn_implementation(adapter.attn_implementation)
    t = time.perf_counter()
    inputs = adapter.finalize(adapter(batch))
    inputs.pop("vlmdata", None)
    loss = model(**inputs).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def measure(packs: list[dict], model_dir: str, pad_id: int, warmup: int, attn: str) -> dict:
    from vlmdata.hf import HFBatchAdapter, ModelSpec, load_model, make_adapter

    spec = ModelSpec.from_folder(model_dir)
    torch.manual_seed(0)
    model = load_model(model_dir, attn_implementation=attn).train()
    packed = HFBatchAdapter.for_model(spec, model)
    padded = make_adapter(spec, "sdpa")          # padded rows: transformers' own sdpa path with its padding mask
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    measured = packs[warmup:]
    layouts = {"packed": measured, "padded": shuffled_padded(measured, spec, pad_id),
               "padded_per_pack": [padded_rows(p, pad_id) for p in measured]}
    adapters = {"packed": packed, "padded": padded, "padded_per_pack": padded}
    labels = {k: sum(label_tokens(b) for b in v) for k, v in layouts.items()}
    for p in packs[:warmup]:
        timed_step(model, opt, packed, p)
        timed_step(model, opt, padded, padded_rows(p, pad_id))
    sec = dict.fromkeys(layouts, 0.0)
    names = list(layouts)
    for i in range(max(len(v) for v in layouts.values())):
        for name in names[i % len(names):] + names[:i % len(names)]:
            if i < len(layouts[name]):
                sec[name] += timed_step(model, opt, adapters[name], layouts[name][i])
    real = sum(int(p["cu_seqlens"][-1]) for p in measured)
    slots = {"packed": real}
    for name in ("padded", "padded_per_pack"):
        slots[name] = sum(int(b["input_ids"].numel()) for b in layouts[name])
    return {"real_tokens": real, "slots": slots, "seconds": sec, "labels": labels,
            "batches": {k: len(v) for k, v in layouts.items()}, "tps": {k: real / sec[k] for k in sec},
            "ratio": sec["padded"] / sec["packed"], "ratio_per_pack": sec["padded_per_pack"] / sec["packed"],
            "measured_packs": len(measured), "params": sum(p.numel() for p in model.parameters()),
            "attention": packed.attn_implementation}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--packs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=256, help="the tiny model's hidden size")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--max-pixels", type=int, default=224 * 224, help="the model's max_pixels (images' token cap)")
    ap.add_argument("--corpus", default="raw", choices=("raw", "learnable"))
    ap.add_argument("--attn", default="auto", help="attention implementation (auto: vlmdata_varlen on CPU; "
                    "sdpa: the 4-D block mask)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench_out/bench-hf-packing.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = tempfile.mkdtemp(prefix="bench-hf-packing-")
    try:
        corpus = make_corpus(DemoConfig(samples=args.samples, corpus=args.corpus), os.path.join(work, "raw"))
        data = os.path.join(work, "ds")
        shard(os.path.join(work, "raw"), data, 224)
        from vlmdata.formats import Manifest
        from vlmdata.hf import ModelSpec

        tok = Manifest.load(data).tokenizer
        model_dir = write_model_folder(os.path.join(work, "model"), int(tok["vocab_size"]),
                                       int(tok["special"]["image"]), args.hidden, args.layers, args.max_pixels)
        spec = ModelSpec.from_folder(model_dir)
        spec.check_tokenizer(tok)
        epoch = epoch_packs(data, args.max_tokens, spec.image_policy())
        packs = spread(epoch, args.packs + args.warmup)
        res = measure(packs, model_dir, int(tok["special"]["pad"]), args.warmup, args.attn)
        res["epoch_packs"] = len(epoch)
        lines = describe(args, corpus, res)
        print("\n".join(lines), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_report("\n".join(lines), args.out)
    return 0


def describe(args: argparse.Namespace, corpus: str, res: dict) -> list[str]:
    import transformers

    machine = f"{cpu_model()}, {os.cpu_count()} cores"
    versions = f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}"
    lines = [
        "# bench-hf-packing: packed vs padded batches on a tiny Hugging Face Qwen2-VL (same samples, same run)",
        "",
        f"- command: `{' '.join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:])}`",
        f"- machine: {machine} (load average {os.getloadavg()[0]:.1f} at the end: shared, noisy); {versions}; "
        f"torch threads {args.threads}",
        f"- model: Qwen2VLForConditionalGeneration from a config, hidden {args.hidden}, {args.layers} layers, "
        f"vision depth 2 ({res['params'] / 1e6:.1f} M params), fp32, attention {res['attention']}; images at "
        f"the model's policy "
        f"(dynamic, max_pixels {args.max_pixels})",
        f"- corpus: {args.samples} samples, {corpus}; max_tokens {args.max_tokens}",
        f"- measured: {res['measured_packs']} packs spread evenly over the epoch's {res['epoch_packs']} (after "
        f"{args.warmup} warm-up); the three layouts interleaved step by step (forward, backward, AdamW step each)",
        f"- real tokens: {res['real_tokens']} in every layout; label tokens {res['labels']}",
        "",
        "| layout | batches | token slots (% real) | real tokens/s | seconds |",
        "|---|---|---|---|---|",
    ]
    boundaries = "block-diagonal 4-D mask" if res["attention"] in ("sdpa", "eager") else "cu_seq_lens (varlen)"
    titles = {"packed": f"packed: [1, T], M-RoPE per sample, {boundaries}",
              "padded": "padded batches: shuffled samples, B per batch, padded to longest (baseline)",
              "padded_per_pack": "padded per pack: each pack's samples as padded rows (conservative)"}
    for name, title in titles.items():
        slots = res["slots"][name]
        lines.append(f"| {title} | {res['batches'][name]} | {slots} ({100 * res['real_tokens'] / slots:.1f} %) | "
                     f"{res['tps'][name]:,.0f} | {res['seconds'][name]:.2f} |")
    lines += ["", f"**speed-up vs padded batches: {res['ratio']:.2f}x** (target >= 1.8x); "
                  f"vs the conservative per-pack padding: {res['ratio_per_pack']:.2f}x"]
    return lines


if __name__ == "__main__":
    sys.exit(main())
