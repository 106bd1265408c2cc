"""The exact fast path for SentencePiece-style BPE vocabularies (Llama 2, Mistral): "▁" for spaces, byte fallback.

Such a tokenizer.json has either the normalizer `Sequence[Prepend("▁"), Replace(" ", "▁")]` and no
pre-tokenizer (transformers' legacy Llama conversion) or no normalizer and a `Metaspace("▁", split=False)`
pre-tokenizer with prepend_scheme first/always/never. Either way `tokenizers` runs its BPE over each whole
text between added tokens, as one word; this path cuts that word into pieces and runs (and remembers) the
tokenizer's own BPE per piece. Why the ids are equal (checked when the family loads, `MetaspaceBPE.build_from`):

- Pieces: the word is cut before every "▁" that follows another character. A merge joins two adjacent
  symbols into a vocabulary token, so a merge across such a cut would make a token holding "x▁" (x not
  "▁"). The vocabulary must hold no such token; then no symbol ever spans a cut, the merges on either side
  never see each other, and BPE(word) = BPE(piece) + BPE(piece) + ... in any merge order. "▁" itself and
  the 256 `<0xNN>` byte tokens must be in the vocabulary (byte fallback on), so no unknown token (and no
  fused unknowns across a cut) is possible.
- Normalizing: only " " -> "▁" and the prepended "▁", done here in plain Python: no Unicode tables. A text
  that already holds a "▁" falls back to `tokenizers` (its offsets would not be one byte per space).
- Added tokens, post-processor, dropout, ignore_merges: as the byte-level path (`fast_bpe`), plus
  ignore_merges must be off (it looks the whole word up, which a cut word does not reproduce).
- Probe texts are encoded by both at build time; any difference refuses the path.
"""
from __future__ import annotations

import re

from vlmdata.text.fast_bpe import FastBPE, post_processor_specials, unsupported_common

__all__ = ["MetaspaceBPE"]

SPACE = "\u2581"                               # "▁", SentencePiece's space
LEGACY_NORMALIZER = {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": SPACE}, {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}]}
BYTE_TOKEN = re.compile("<0x[0-9A-F]{2}>")
CROSSING = re.compile(f"[^{SPACE}]{SPACE}")     # a token that would span a cut
PROBES = ("hello world", " leading space", "two  spaces  ", "tab\tnew\nline\r\n", "naïve café 東京 😀 ️ \u0301x",
          "digits 1234 3.14", "", " ")


def _prepend_mode(cfg: dict) -> str | None:
    """How the tokenizer adds the leading "▁": "segment" (legacy normalizer: before every text between added
    tokens), "first"/"always"/"never" (Metaspace's scheme); None when this is not such a tokenizer."""
    norm, pre = cfg.get("normalizer"), cfg.get("pre_tokenizer")
    if pre is None and norm == LEGACY_NORMALIZER:
        return "segment"
    if (norm is None and isinstance(pre, dict) and pre.get("type") == "Metaspace" and pre.get("replacement") == SPACE
            and pre.get("split") is False and pre.get("prepend_scheme") in ("first", "always", "never")):
        return pre["prepend_scheme"]
    return None


def unsupported_metaspace(cfg: dict, tokenizer) -> str | None:
    """Why the Metaspace fast path cannot reproduce this tokenizer (None when it can)."""
    reason = unsupported_common(cfg, tokenizer)
    if reason:
        return reason
    if _prepend_mode(cfg) is None:
        return "the normalizer / pre-tokenizer is not a known Metaspace form"
    model = cfg["model"]
    if model.get("ignore_merges"):
        return "the BPE has ignore_merges set"
    vocab = model.get("vocab") or {}
    if not model.get("byte_fallback") or SPACE not in vocab or any(f"<0x{b:02X}>" not in vocab for b in range(256)):
        return "the BPE lacks byte fallback, its 256 byte tokens or the '▁' token"
    crossing = next((t for t in vocab if CROSSING.search(t)), None)
    if crossing is not None:
        return f"the vocabulary has a token across a word start ({crossing!r}): the BPE cannot be cut into pieces"
    return None


class MetaspaceBPE(FastBPE):
    """The exact fast encoder of a SentencePiece-style BPE tokenizer (see the module docstring)."""

    _bad: frozenset = frozenset()                # no character needs a check: normalizing is Unicode-free
    _split_word = re.compile(f"{SPACE}*[^{SPACE}]+|{SPACE}+").findall

    def __init__(self, tokenizer, added: dict[str, int], vocab: dict[str, int], prepend: str,
                 specials: tuple | None = None):
        self._init_common(tokenizer, added, specials)
        self._prepend = prepend
        self._token_bytes = [0] * (max(vocab.values(), default=-1) + 1)
        for token, tid in vocab.items():        # UTF-8 bytes of the normalized text each token covers
            self._token_bytes[tid] = 1 if BYTE_TOKEN.fullmatch(token) else len(token.encode("utf-8"))

    @staticmethod
    def recognizes(cfg: dict) -> bool:
        """Whether the tokenizer is SentencePiece-style (the Prepend/Replace normalizer or Metaspace), exactly
        reproducible or not."""
        pre = cfg.get("pre_tokenizer")
        norms = (cfg.get("normalizer") or {}).get("normalizers") or [cfg.get("normalizer") or {}]
        return ((isinstance(pre, dict) and pre.get("type") == "Metaspace")
                or any(isinstance(n, dict) and n.get("type") == "Prepend" for n in norms))

    @classmethod
    def build_from(cls, tokenizer, cfg: dict) -> tuple[MetaspaceBPE | None, str | None]:
        """(encoder, None), or (None, the reason) when the path would not give `tokenizers`' ids exactly."""
        reason = unsupported_metaspace(cfg, tokenizer)
        specials = post_processor_specials(tokenizer) if not reason else None
        if reason or isinstance(specials, str):
            return None, reason or specials
        added = {a["content"]: a["id"] for a in cfg.get("added_tokens") or () if a.get("content")}
        fast = cls(tokenizer, added, cfg["model"]["vocab"], _prepend_mode(cfg), specials)
        probes = [*PROBES, *(f"a {t} b{t}{t} c" for t in list(added)[:8])]
        for text in probes:
            mine, theirs = fast.encode(text), tokenizer.encode(text)
            if mine is None or (mine.ids, mine.offsets) != (theirs.ids, theirs.offsets):
                return None, f"probe text {text!r} encodes unlike tokenizers"
        fast.clear_cache()
        return fast, None

    def _model_input(self, piece: str) -> str:
        return piece

    def _adds_lead(self, word: str, start: int) -> bool:
        """Whether the tokenizer puts a "▁" before this text between added tokens (at character `start`)."""
        if self._prepend == "segment":
            return True
        if self._prepend == "never" or word.startswith(SPACE):
            return False
        return self._prepend == "always" or start == 0

    def split(self, text: str):
        """(pieces, their ids or None where not yet known, the pieces with a prepended "▁"), or None: this text
        is for `tokenizers`."""
        parts = self._added_split(text) if self._added_split else [text]
        pieces: list[str] = []
        entries: list[tuple[int, ...] | None] = []
        leads: set[int] | None = None
        start = 0
        for i, part in enumerate(parts):
            if i % 2:
                pieces.append(part)
                entries.append((self._added[part],))
            elif part:
                if SPACE in part:
                    return None
                word = part.replace(" ", SPACE)
                if self._adds_lead(word, start):
                    word = SPACE + word
                    leads = leads or set()
                    leads.add(len(pieces))
                found = self._split_word(word)
                pieces += found
                entries += map(self._cache.get, found)
            start += len(part)
        return pieces, entries, leads
