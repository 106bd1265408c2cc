"""Which exact fast path encodes a tokenizer: the byte-level one (`fast_bpe`: Qwen2, Llama 3, GPT-2) or the
SentencePiece-style one (`metaspace_bpe`: Llama 2, Mistral); each refuses, saying why, what it cannot
reproduce exactly, and then `tokenizers` encodes."""
from __future__ import annotations

import json
import os

from vlmdata.text.fast_bpe import FastBPE
from vlmdata.text.metaspace_bpe import MetaspaceBPE

__all__ = ["build_fast_path"]


def build_fast_path(tokenizer, tokenizer_json: str) -> tuple[FastBPE | None, str | None]:
    """(encoder, None), or (None, why no fast path applies); VLMDATA_FAST_TOKENIZER=0 turns both off."""
    if os.environ.get("VLMDATA_FAST_TOKENIZER", "1") == "0":
        return None, "VLMDATA_FAST_TOKENIZER=0"
    cfg = json.loads(tokenizer_json)
    if MetaspaceBPE.recognizes(cfg):
        return MetaspaceBPE.build_from(tokenizer, cfg)
    return FastBPE.build_from(tokenizer, cfg)
