#!/usr/bin/env python
"""Varlen attention backends against padded SDPA at the same tokens: time and peak memory.

Packs are filled with samples whose lengths follow gen_raw's statistics (LLaVA layout, 576 tokens per
336 px image; `vlmdata.testing.gen_raw_lengths`) up to `--tokens` tokens each. For every pack:

- each varlen backend usable here (`vlmdata_pipelines.attention.available_backends`: "reference" anywhere;
  "torch" = torch.nn.attention.varlen and "flash" = flash-attn on a CUDA device in bf16/fp16) runs on
  q, k, v of shape [T, H, D] with the pack's cu_seqlens;
- the padded baseline holds the same samples as B rows padded to the longest, [B, H, L, D]:
  "padded SDPA (causal)" runs scaled_dot_product_attention with is_causal=True (right padding needs no
  mask for a causal model: the fastest padded form), and "padded SDPA (mask)" passes the boolean
  causal + key-padding mask that a padded batch with an attention mask uses (skipped for a pack whose
  [B, H, L, L] scores, which a masked SDPA kernel may materialise, would exceed `--mask-limit-gb`).

Timed: forward, and forward + backward (gradients of q, k, v), interleaved backend by backend in each
round. Peak memory: the extra memory one forward + backward allocates (CUDA: max_memory_allocated;
CPU: the allocator's events under torch.profiler(profile_memory=True)). Each backend's output is
compared with the reference on the real tokens.

    python tools/bench_attention.py [--device auto|cpu|cuda] [--tokens 4096] [--heads 8] [--head-dim 64]
                                    [--packs 4] [--rounds 5] [--out bench_out/bench-attention.md]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import gen_raw_lengths, write_report  # noqa: E402
from vlmdata_pipelines.attention import available_backends, varlen_attention  # noqa: E402

PADDED_CAUSAL, PADDED_MASK = "padded SDPA (causal)", "padded SDPA (mask)"


def make_packs(count: int, tokens: int, seed: int) -> list[list[int]]:
    """Sample lengths of `count` packs of <= `tokens` tokens: each pack takes, in arrival order, every
    waiting sample that still fits (a greedy fill like the loader's packer; longer samples are cut)."""
    pool = [min(n, tokens) for n in gen_raw_lengths(count * 256, seed=seed)[0].tolist()]
    packs = []
    while len(packs) < count and pool:
        cur, used, rest = [], 0, []
        for n in pool:
            if used + n <= tokens:
                cur.append(n)
                used += n
            else:
                rest.append(n)
        packs.append(cur)
        pool = rest
    return packs


class Case:
    """One pack's tensors in the varlen and the padded layouts (same values on the real tokens)."""

    def __init__(self, lengths: list[int], heads: int, dim: int, device: torch.device, dtype: torch.dtype,
                 seed: int):
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.lengths, self.total, self.longest = lengths, sum(lengths), max(lengths)
        self.q, self.k, self.v = (torch.randn(self.total, heads, dim, generator=g).to(device, dtype)
                                  for _ in range(3))
        self.cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)
        b, L = len(lengths), self.longest
        self.valid = torch.zeros(b, L, dtype=torch.bool, device=device)
        for i, n in enumerate(lengths):
            self.valid[i, :n] = True
        self.padded = [self._pad(t) for t in (self.q, self.k, self.v)]  # [B, H, L, D]
        causal = torch.ones(L, L, dtype=torch.bool, device=device).tril()
        self.mask = None
        self._causal = causal

    def _pad(self, t: torch.Tensor) -> torch.Tensor:
        b, L = len(self.lengths), self.longest
        out = torch.zeros(b, L, *t.shape[1:], dtype=t.dtype, device=t.device)
        out[self.valid] = t
        return out.transpose(1, 2).contiguous()

    def build_mask(self) -> None:
        key_ok = self.valid[:, None, None, :]
        self.mask = self._causal[None, None] & key_ok  # [B, 1, L, L]
        # a fully masked row (a pad query) would give NaN; let pad queries see their first key
        self.mask[..., 0] |= True

    def unpad(self, out: torch.Tensor) -> torch.Tensor:
        return out.transpose(1, 2)[self.valid]

    def slots(self, name: str) -> int:
        return self.total if name not in (PADDED_CAUSAL, PADDED_MASK) else len(self.lengths) * self.longest


def runner(name: str, case: Case) -> Callable[[bool], torch.Tensor]:
    """fn(backward) -> output on the real tokens [T, H, D] (after a backward through it when asked)."""
    def leafs(ts):
        return [t.detach().requires_grad_(True) for t in ts]

    if name in (PADDED_CAUSAL, PADDED_MASK):
        def run(backward: bool) -> torch.Tensor:
            q, k, v = leafs(case.padded) if backward else case.padded
            if name == PADDED_CAUSAL:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=case.mask)
            if backward:
                out.float().sum().backward()
            return case.unpad(out)
        return run

    def run(backward: bool) -> torch.Tensor:
        q, k, v = leafs((case.q, case.k, case.v)) if backward else (case.q, case.k, case.v)
        out = varlen_attention(q, k, v, case.cu, case.longest, causal=True, backend=name)
        if backward:
            out.float().sum().backward()
        return out
    return run


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Extra memory allocated at the peak of one call of fn (beyond what was allocated before)."""
    if device.type == "cuda":
        sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    raw = getattr(prof.profiler, "kineto_results", None)
    if raw is not None:
        deltas = sorted((e.start_ns(), e.nbytes()) for e in raw.events() if e.name() == "[memory]")
    else:
        deltas = sorted((e.time_range.start, e.cpu_memory_usage) for e in prof.events() if e.name == "[memory]")
    cur = peak = 0
    for _, n in deltas:
        cur += n
        peak = max(peak, cur)
    return peak


def measure(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict:
    names = available_backends(device, dtype) + [PADDED_CAUSAL, PADDED_MASK]
    packs = make_packs(args.packs, args.tokens, args.seed)
    res = {n: {"fwd": 0.0, "fwdbwd": 0.0, "peak": 0, "err": 0.0, "slots": 0, "skipped": None} for n in names}
    # a [B, 1, L, L] mask sends SDPA to a kernel that materialises the [B, H, L, L] scores: run the masked
    # baseline on every pack or on none, so that every row of the table covers the same packs
    itemsize = torch.finfo(dtype).bits // 8
    scores = max(len(p) * args.heads * max(p) ** 2 * itemsize for p in packs)
    if scores > args.mask_limit_gb * 2**30:
        res[PADDED_MASK]["skipped"] = (f"its [B, H, L, L] scores would take {scores / 2**30:.2f} GiB "
                                       f"(> --mask-limit-gb {args.mask_limit_gb})")
    real = 0
    for p, lengths in enumerate(packs):
        case = Case(lengths, args.heads, args.head_dim, device, dtype, seed=args.seed + p)
        real += case.total
        if res[PADDED_MASK]["skipped"] is None:
            case.build_mask()
        live = [n for n in names if not (n == PADDED_MASK and case.mask is None)]
        runs = {n: runner(n, case) for n in live}
        with torch.no_grad():
            ref = runs["reference"](False).float()
        for n in live:
            res[n]["slots"] += case.slots(n)
            with torch.no_grad():
                out = runs[n](False).float()
            res[n]["err"] = max(res[n]["err"], float((out - ref).abs().max()))
            for _ in range(args.warmup):
                runs[n](True)
            res[n]["peak"] = max(res[n]["peak"], peak_bytes(lambda fn=runs[n]: fn(True), device))
        for r in range(args.rounds):
            k = r % len(live)
            for n in live[k:] + live[:k]:  # rotate the order: noise hits every backend alike
                for mode, backward in (("fwd", False), ("fwdbwd", True)):
                    sync(device)
                    t = time.perf_counter()
                    if backward:
                        runs[n](True)
                    else:
                        with torch.no_grad():
                            runs[n](False)
                    sync(device)
                    res[n][mode] += time.perf_counter() - t
        del case, runs
    for n in names:
        if res[n]["slots"]:
            res[n]["fwd"] /= args.rounds * len(packs)
            res[n]["fwdbwd"] /= args.rounds * len(packs)
    return {"backends": res, "packs": packs, "real_tokens": real}


def report(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, m: dict) -> list[str]:
    if device.type == "cuda":
        where = f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    else:
        where = f"CPU, {torch.get_num_threads()} torch threads"
    try:
        import flash_attn
        fa = f"flash-attn {flash_attn.__version__}"
    except ImportError:
        fa = "flash-attn not installed"
    packs = m["packs"]
    lines = [
        "# bench-attention: varlen backends vs padded SDPA at the same tokens",
        "",
        f"- command: `{' '.join(['tools/bench_attention.py'] + sys.argv[1:])}`",
        f"- machine: {cpu_model()}, {os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f}); device {where}; "
        f"python {platform.python_version()}, torch {torch.__version__}, {fa}",
        f"- {len(packs)} packs of <= {args.tokens} tokens, {sum(map(len, packs))} samples (gen_raw lengths, "
        f"{min(map(len, packs))}-{max(map(len, packs))} per pack, longest {max(max(p) for p in packs)}); "
        f"{args.heads} heads x {args.head_dim}, {str(dtype).replace('torch.', '')}, causal; "
        f"{args.rounds} rounds per pack, backends interleaved",
        "",
        "| backend | forward ms | fwd+bwd ms | fwd+bwd vs padded (causal) | peak extra memory | "
        "token slots (real %) | max abs diff vs reference |",
        "|---|---|---|---|---|---|---|",
    ]
    base = m["backends"][PADDED_CAUSAL]["fwdbwd"]
    for name, r in m["backends"].items():
        if not r["slots"]:
            lines.append(f"| {name} | - | - | - | - | - | skipped: {r['skipped']} |")
            continue
        lines.append(f"| {name} | {1000 * r['fwd']:.2f} | {1000 * r['fwdbwd']:.2f} | {base / r['fwdbwd']:.2f}x | "
                     f"{r['peak'] / 2**20:.1f} MiB | {r['slots']} ({100 * m['real_tokens'] / r['slots']:.0f} %) | "
                     f"{r['err']:.2e} |")
    missing = [b for b in ("torch", "flash") if b not in m["backends"]]
    if missing:
        lines += ["", f"Not usable here: {', '.join(missing)} (need a CUDA device and bf16/fp16"
                      f"{'; flash-attn is not installed' if 'flash' in missing and fa.endswith('installed') else ''})."]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda[:N]")
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                    help="auto: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per pack (default 4096 CPU, 16384 CUDA)")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--packs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mask-limit-gb", type=float, default=1.0)
    ap.add_argument("--require-gpu", action="store_true", help="fail unless a CUDA device is used")
    ap.add_argument("--out", default="bench_out/bench-attention.md")
    args = ap.parse_args()
    name = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: torch {torch.__version__} sees no CUDA device")
    if args.require_gpu and device.type != "cuda":
        raise SystemExit("--require-gpu: no CUDA device in use")
    dtype = (torch.bfloat16 if device.type == "cuda" else torch.float32) if args.dtype == "auto" \
        else getattr(torch, args.dtype)
    if args.tokens is None:
        args.tokens = 16384 if device.type == "cuda" else 4096
    m = measure(args, device, dtype)
    lines = report(args, device, dtype, m)
    print("\n".join(lines))
    write_report("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
