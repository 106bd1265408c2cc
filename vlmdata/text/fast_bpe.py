"""An exact fast path for byte-level BPE tokenizers: the same ids and offsets as `tokenizers`, a few times faster.

`tokenizers` spends most of a short conversation's time around the BPE, not in it:
added-token matching, normalizing, pre-tokenizing with offsets, building an
`Encoding`. This path does the same steps with C-level Python loops and keeps
the BPE of every distinct piece (pre-tokenized word) in a dictionary. Natural
text repeats its words, so the BPE runs once per new word.

Why the ids are equal, step by step (checked when the family loads, `FastBPE.build`):

- BPE: each new piece is encoded by the tokenizer's own model (`tokenizer.model.tokenize`),
  so it is `tokenizers`' BPE by construction, whatever its merges (dropout must be off).
- Added tokens: every added token must be `normalized=False` with no lstrip/rstrip/
  single_word; they are split out of the raw text leftmost-longest, as `tokenizers`'
  added vocabulary does. Any other flag: not this path.
- Normalizer: none or NFC. Under NFC, a text segment that is not NFC-stable (Python's
  `unicodedata`) falls back to `tokenizers` for the whole sample, so offsets never move;
  characters Python's tables leave unassigned fall back too (normalization stability
  then makes Python's NFC verdict the same as any later Unicode version's).
- Pre-tokenizer: a `Split(Regex, isolated)` + `ByteLevel(use_regex=False)` pair or a
  `ByteLevel(use_regex=True)`, with a pattern from `KNOWN_PATTERNS` (Qwen2, Llama 3,
  GPT-2). Those patterns use only alternation, greedy runs, one negative lookahead and
  case-insensitive ASCII contractions, which the `regex` module and Oniguruma evaluate
  alike; what could differ is each character's classes (\\p{L}, \\p{N}, \\s, case folds:
  two Unicode table versions). So every character is checked once before the path uses
  it: probe strings that give a different split for each class and fold are
  pre-tokenized by the tokenizer's own pre-tokenizer and by this path, and a character
  whose splits differ (or that Python's tables leave unassigned) sends its samples to
  `tokenizers`.
- Post-processor: none (or ByteLevel without offset trimming); no truncation or padding.

Offsets (for trained-span marking) come from the token byte lengths within each piece:
a token covers the characters its bytes touch, which is what `tokenizers` reports.
"""
from __future__ import annotations

import bisect
import json
import os
import re
import unicodedata
from itertools import accumulate, chain

__all__ = ["FastBPE", "FastEncoding", "KNOWN_PATTERNS", "encode_texts"]

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
KNOWN_PATTERNS = (
    # Qwen2 / Qwen2.5 / Qwen3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    # Llama 3 (cl100k-style digits in threes)
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    GPT2_PATTERN,
)
# The same patterns over ASCII text: \p{L}, \p{N} and \s restricted to ASCII, for the faster `re` engine
# (both splitters' ASCII behaviour is checked against the pre-tokenizer like any other character).
ASCII_CLASSES = ((r"[^\r\n\p{L}\p{N}]", r"[^\r\nA-Za-z0-9]"), (r"[^\s\p{L}\p{N}]", r"[^\t\n\x0b\x0c\r A-Za-z0-9]"),
                 (r"\p{L}", "[A-Za-z]"), (r"\p{N}", "[0-9]"), (r"(?!\S)", r"(?![^\t\n\x0b\x0c\r ])"),
                 (r"\s", r"[\t\n\x0b\x0c\r ]"))
SHORT_SEGMENT = 64                  # texts between added tokens up to this long keep their split (template parts)
COLD_MISSES = 16                    # a text with more new pieces than this, and over a quarter new, goes to tokenizers
WINDOW = 64                         # texts per cold-rate window (see FastBPE._back_off)
MAX_CACHED_PIECES = 1 << 18       # ~40 MB of pieces and ids; cleared when full
# Contexts around a probed character c: together they split differently for each of the classes
# the known patterns test (letter, number, whitespace, other) and for a case fold onto the
# letters of the contractions ('s 't 'm 'd 're 've 'll).
PROBES = ("1a{}.1", "1{}a1", "1'{}b1", "1'{}eb1", "1'{}lb1", "1'r{}b1", "1'l{}b1")


def _byte_table() -> list[str]:
    """GPT-2's byte -> character map used by byte-level BPE (`tokenizers`' ByteLevel)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def ascii_pattern(pattern: str) -> str:
    """`pattern` for ASCII-only text, in the syntax of Python's `re`."""
    for unicode_class, ascii_class in ASCII_CLASSES:
        pattern = pattern.replace(unicode_class, ascii_class)
    return pattern


def _pattern_of(pre: dict | None) -> str | None:
    """The split pattern of a byte-level pre-tokenizer this path reproduces, else None."""
    if not isinstance(pre, dict):
        return None
    if pre.get("type") == "ByteLevel":
        return GPT2_PATTERN if pre.get("use_regex", True) and not pre.get("add_prefix_space") else None
    if pre.get("type") != "Sequence" or len(pre.get("pretokenizers") or ()) != 2:
        return None
    split, level = pre["pretokenizers"]
    if (split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert")
            or level.get("type") != "ByteLevel" or level.get("use_regex") or level.get("add_prefix_space")):
        return None
    pattern = (split.get("pattern") or {}).get("Regex")
    return pattern if pattern in KNOWN_PATTERNS else None


def unsupported_common(cfg: dict, tokenizer) -> str | None:
    """Why no fast path (byte-level or Metaspace) can reproduce this tokenizer's model, added tokens and
    settings (None when they are fine)."""
    model = cfg.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout"):
        return "the model is not a BPE without dropout"
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return "the BPE has a subword prefix or suffix"
    if tokenizer.truncation is not None or tokenizer.padding is not None or tokenizer.encode_special_tokens:
        return "truncation, padding or encode_special_tokens is set"
    for added in cfg.get("added_tokens") or ():
        if added.get("normalized") or added.get("lstrip") or added.get("rstrip") or added.get("single_word"):
            return f"added token {added.get('content')!r} has normalized/lstrip/rstrip/single_word set"
    return None


def unsupported(cfg: dict, tokenizer) -> str | None:
    """Why the byte-level fast path cannot reproduce this tokenizer (None when it can)."""
    reason = unsupported_common(cfg, tokenizer)
    if reason:
        return reason
    if (cfg.get("normalizer") or {"type": "NFC"}).get("type") != "NFC":
        return f"normalizer {cfg['normalizer'].get('type')} is not NFC"
    if _pattern_of(cfg.get("pre_tokenizer")) is None:
        return "the pre-tokenizer is not a known byte-level split"
    if not all(c in (cfg["model"].get("vocab") or {}) for c in _byte_table()):
        return "the vocabulary lacks some of the 256 byte tokens"
    return None


def _template_ids(step: dict) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(ids before, ids after) the one sequence of a TemplateProcessing's single template, else None."""
    before: list[int] = []
    after: list[int] = []
    seen_sequence = False
    for item in step.get("single") or ():
        if "Sequence" in item and item["Sequence"].get("id") == "A" and not seen_sequence:
            seen_sequence = True
        elif "SpecialToken" in item:
            special = (step.get("special_tokens") or {}).get(item["SpecialToken"].get("id"))
            if not special or not special.get("ids"):
                return None
            (after if seen_sequence else before).extend(special["ids"])
        else:
            return None
    return (tuple(before), tuple(after)) if seen_sequence else None


def post_processor_specials(tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]] | str:
    """(prefix, suffix): the special tokens the loaded post-processor puts around one text (ModelFamily may
    have set a TemplateProcessing); or why this path cannot reproduce the post-processor."""
    post = tokenizer.post_processor
    if post is None:
        return (), ()
    kind = type(post).__name__
    if kind == "ByteLevel":
        return ((), ()) if not getattr(post, "trim_offsets", True) else "post-processor ByteLevel trims offsets"
    if kind not in ("TemplateProcessing", "Sequence"):
        return f"post-processor {kind} is not one this path reproduces"
    cfg = json.loads(tokenizer.to_str())["post_processor"]
    steps = cfg.get("processors") or () if cfg.get("type") == "Sequence" else (cfg,)
    found: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    templates = 0
    for step in steps:
        if step.get("type") == "ByteLevel" and not step.get("trim_offsets", True):
            continue
        ids = _template_ids(step) if step.get("type") == "TemplateProcessing" else None
        templates += 1
        if ids is None or templates > 1:
            return f"post-processor {step.get('type')} adds tokens or moves offsets in a way this path does not"
        found = ids
    return found


class FastEncoding:
    """The ids of one text and, on demand, the `tokenizers.Encoding` offset queries `ModelFamily` uses.

    `pieces` are the texts the BPE saw (for a Metaspace vocabulary: after " " -> "▁"); a piece in `leads`
    starts with one character the normalizer added, which `tokenizers` aligns with the piece's first
    character. `prefix` and `suffix` are the post-processor's special tokens (offsets (0, 0))."""

    __slots__ = ("_bytes", "_char_starts", "_entries", "_leads", "_pieces", "_prefix", "_suffix", "_tok_starts", "ids")

    def __init__(self, pieces: list[str], entries: list[tuple[int, ...]], token_bytes, leads=None,
                 prefix: tuple[int, ...] = (), suffix: tuple[int, ...] = ()):
        self._pieces = pieces
        self._entries = entries
        self._bytes = token_bytes
        self._leads = leads
        self._prefix, self._suffix = len(prefix), len(suffix)
        self._char_starts = self._tok_starts = None
        self.ids = list(chain(prefix, chain.from_iterable(entries), suffix))

    def _lead(self, p: int) -> int:
        return 1 if self._leads and p in self._leads else 0

    def _index(self) -> None:
        if self._char_starts is None:
            lengths = list(map(len, self._pieces))
            for p in self._leads or ():
                lengths[p] -= 1                          # the added "▁" is no character of the text
            self._char_starts = list(accumulate(lengths, initial=0))
            self._tok_starts = list(accumulate(map(len, self._entries), initial=self._prefix))

    def _piece_offsets(self, p: int) -> list[tuple[int, int]]:
        """(start, end) characters within piece p of each of its tokens: the characters its bytes touch."""
        piece, entry, lead = self._pieces[p], self._entries[p], self._lead(p)
        if len(entry) == 1:
            return [(0, len(piece) - lead)]
        char_of_byte = [max(i - lead, 0) for i, ch in enumerate(piece) for _ in range(len(ch.encode("utf-8")))]
        out, pos = [], 0
        for tid in entry:
            n = self._bytes[tid]
            out.append((char_of_byte[pos], char_of_byte[pos + n - 1] + 1))
            pos += n
        return out

    def char_to_token(self, pos: int) -> int | None:
        self._index()
        if pos < 0 or pos >= self._char_starts[-1]:
            return None
        p = bisect.bisect_right(self._char_starts, pos) - 1
        rel = pos - self._char_starts[p]
        for k, (a, b) in enumerate(self._piece_offsets(p)):
            if a <= rel < b:
                return self._tok_starts[p] + k
        return None

    def token_to_chars(self, token: int) -> tuple[int, int] | None:
        self._index()
        if token < self._prefix or token >= len(self.ids) - self._suffix:
            return None                                  # out of range, or a post-processor special token
        p = bisect.bisect_right(self._tok_starts, token) - 1
        a, b = self._piece_offsets(p)[token - self._tok_starts[p]]
        base = self._char_starts[p]
        return base + a, base + b

    def tokens_over(self, a: int, b: int) -> tuple[int | None, int | None]:
        """(first, last) token whose characters overlap [a, b), or (None, None): what `ModelFamily` computes
        from `offsets`, without building them (token offsets rise monotonically, so the overlap is a run)."""
        self._index()
        total = self._char_starts[-1]
        if a < 0:                                    # the specials' (0, 0) overlap too: count them one by one
            over = [i for i, (x, y) in enumerate(self.offsets) if x < b and y > a]
            return (over[0], over[-1]) if over else (None, None)
        if a >= total or b <= 0:
            return None, None
        p = bisect.bisect_right(self._char_starts, a) - 1
        base = self._char_starts[p]
        first = next(self._tok_starts[p] + k for k, (_, end) in enumerate(self._piece_offsets(p)) if base + end > a)
        q = bisect.bisect_right(self._char_starts, min(b, total) - 1) - 1
        base, offs = self._char_starts[q], self._piece_offsets(q)
        last = next(self._tok_starts[q] + k for k in range(len(offs) - 1, -1, -1) if base + offs[k][0] < b)
        return (first, last) if first <= last else (None, None)

    @property
    def offsets(self) -> list[tuple[int, int]]:
        """Every token's (start, end) characters, as `tokenizers.Encoding.offsets` ((0, 0) for a
        post-processor's special token); one pass over the pieces."""
        self._index()
        out = [(0, 0)] * self._prefix
        for p, base in enumerate(self._char_starts[:-1]):
            if len(self._entries[p]) == 1:
                out.append((base, self._char_starts[p + 1]))
            else:
                out += [(base + a, base + b) for a, b in self._piece_offsets(p)]
        return out + [(0, 0)] * self._suffix


class FastBPE:
    """The exact fast encoder of one tokenizer (`build` returns None, and why, when it does not apply)."""

    def __init__(self, tokenizer, pattern: str, added: dict[str, int], nfc: bool = True, vocab: dict | None = None,
                 specials: tuple | None = None):
        import regex

        self._init_common(tokenizer, added, specials)
        self._nfc = nfc
        self._split = regex.compile(pattern).findall
        self._split_ascii = re.compile(ascii_pattern(pattern)).findall
        self._table = _byte_table()
        vocab = vocab if vocab is not None else tokenizer.get_vocab(with_added_tokens=False)
        self._token_bytes = [0] * (max(vocab.values(), default=-1) + 1)
        for token, tid in vocab.items():
            self._token_bytes[tid] = len(token)          # byte-level: one character per byte
        self._good: set[str] = set()
        self._bad: set[str] = set()
        self._check_chars({chr(i) for i in range(128)})

    def _init_common(self, tokenizer, added: dict[str, int], specials: tuple | None) -> None:
        """The state every fast path keeps: added tokens, caches, counters, the post-processor's specials
        (`post_processor_specials`, found here when None)."""
        self._tok = tokenizer
        self._added = added
        self._added_split = (re.compile("(" + "|".join(map(re.escape, sorted(added, key=len, reverse=True))) + ")").split
                             if added else None)
        self._cache: dict[str, tuple[int, ...]] = {}      # piece -> its BPE ids
        self._segments: dict[str, list[str]] = {}         # short text between added tokens -> its pieces
        self.stats = {"fast": 0, "cold": 0, "fallback": 0}
        self._window, self._backoff, self._skip = [0, 0], 0, 0
        specials = post_processor_specials(tokenizer) if specials is None else specials
        self._specials = specials if isinstance(specials, tuple) else ((), ())

    @classmethod
    def build(cls, tokenizer, tokenizer_json: str) -> tuple[FastBPE | None, str | None]:
        """(encoder, None), or (None, the reason) when the tokenizer is not one this path reproduces exactly."""
        if os.environ.get("VLMDATA_FAST_TOKENIZER", "1") == "0":
            return None, "VLMDATA_FAST_TOKENIZER=0"
        return cls.build_from(tokenizer, json.loads(tokenizer_json))

    @classmethod
    def build_from(cls, tokenizer, cfg: dict) -> tuple[FastBPE | None, str | None]:
        """`build` from the parsed tokenizer.json."""
        try:
            import regex  # noqa: F401
        except ImportError:
            return None, "the regex package is not installed (pip install 'vlmdata[fast-text]')"
        reason = unsupported(cfg, tokenizer)
        specials = post_processor_specials(tokenizer) if not reason else None
        if reason or isinstance(specials, str):
            return None, reason or specials
        added = {a["content"]: a["id"] for a in cfg.get("added_tokens") or () if a.get("content")}
        fast = cls(tokenizer, _pattern_of(cfg["pre_tokenizer"]), added, nfc=cfg.get("normalizer") is not None,
                   vocab=cfg["model"]["vocab"], specials=specials)
        if fast.bad_characters:
            return None, f"ASCII characters {''.join(sorted(fast.bad_characters))!r} split unlike the pre-tokenizer"
        return fast, None

    def clear_cache(self) -> None:
        """Forget the pieces' BPE and the cold-text history (the next texts are encoded as by a fresh process)."""
        self._cache.clear()
        self._segments.clear()
        self._window, self._backoff, self._skip = [0, 0], 0, 0

    @property
    def bad_characters(self) -> frozenset[str]:
        """Characters seen so far that split unlike the tokenizer's pre-tokenizer (their samples fall back)."""
        return frozenset(self._bad)

    # ---- character checks ------------------------------------------------------------------
    def _mapped(self, pieces: list[str]) -> list[str]:
        return ["".join(self._table[b] for b in p.encode("utf-8")) for p in pieces]

    def _check_chars(self, chars: set[str]) -> None:
        """Sort new characters into good (split as `tokenizers` splits them) and bad."""
        pre = self._tok.pre_tokenizer
        for c in chars - self._good - self._bad:
            if unicodedata.category(c) in ("Cn", "Cs"):
                self._bad.add(c)
                continue
            probe = "".join(p.format(c) for p in PROBES)
            theirs = [s for s, _ in pre.pre_tokenize_str(probe)]
            same = theirs == self._mapped(self._split(probe))
            if c.isascii():
                same = same and theirs == self._mapped(self._split_ascii(probe))
            (self._good if same else self._bad).add(c)

    def _pieces_of(self, segment: str) -> list[str] | None:
        """The pre-tokenized pieces of an added-token-free segment; None: `tokenizers` must encode the sample."""
        if segment.isascii():
            pieces = self._split_ascii(segment)
        else:
            chars = set(segment)
            if not chars <= self._good:
                self._check_chars(chars)
                if chars & self._bad:
                    return None
            if self._nfc and not unicodedata.is_normalized("NFC", segment):
                return None
            pieces = self._split(segment)
        return pieces if sum(map(len, pieces)) == len(segment) else None

    # ---- encoding ----------------------------------------------------------------------------
    def _segment_pieces(self, segment: str) -> list[str] | None:
        if len(segment) > SHORT_SEGMENT:
            return self._pieces_of(segment)
        pieces = self._segments.get(segment)
        if pieces is None:
            pieces = self._pieces_of(segment)
            if pieces is not None:
                if len(self._segments) >= MAX_CACHED_PIECES:
                    self._segments.clear()
                self._segments[segment] = pieces
        return pieces

    def split(self, text: str) -> tuple[list[str], list[tuple[int, ...] | None], set[int] | None] | None:
        """(pieces, each piece's ids or None where not yet known, the pieces that start with a character the
        normalizer added: none here), or None: this text is for `tokenizers`."""
        parts = self._added_split(text) if self._added_split else [text]
        pieces: list[str] = []
        entries: list[tuple[int, ...] | None] = []
        for i, part in enumerate(parts):
            if i % 2:
                pieces.append(part)
                entries.append((self._added[part],))
            elif part:
                found = self._segment_pieces(part)
                if found is None:
                    return None
                pieces += found
                entries += map(self._cache.get, found)
        return pieces, entries, None

    def _model_input(self, piece: str) -> str:
        """The piece as the BPE model sees it (byte-level: each UTF-8 byte as its character)."""
        return "".join(self._table[b] for b in piece.encode("utf-8"))

    def _bpe(self, piece: str) -> tuple[int, ...]:
        """The tokenizer's own BPE of one piece (remembered)."""
        if len(self._cache) >= MAX_CACHED_PIECES:
            self._cache.clear()
        ids = self._cache[piece] = tuple(t.id for t in self._tok.model.tokenize(self._model_input(piece)))
        return ids

    def _learn(self, pieces: list[str], entries: list, enc, add_special_tokens: bool) -> None:
        """Remember the BPE of the new pieces from `tokenizers`' encoding of the same text: its ids cut where
        the pieces' UTF-8 bytes end. Nothing is kept unless every piece's ids line up."""
        prefix, suffix = self._specials if add_special_tokens else ((), ())
        ids = enc.ids[len(prefix):len(enc.ids) - len(suffix)]
        learned, pos = {}, 0
        try:
            for piece, entry in zip(pieces, entries):
                if entry is not None:                # a known piece or an added token: its ids come next
                    if tuple(ids[pos:pos + len(entry)]) != entry:
                        return
                    pos += len(entry)
                    continue
                start, need = pos, len(piece.encode("utf-8"))
                while need > 0 and pos < len(ids):
                    need -= self._token_bytes[ids[pos]]
                    pos += 1
                if need:
                    return
                learned[piece] = tuple(ids[start:pos])
        except IndexError:
            return                                   # an id outside the vocabulary: not the same pieces
        if pos != len(ids):
            return
        if len(self._cache) + len(learned) >= MAX_CACHED_PIECES:
            self._cache.clear()
        self._cache.update(learned)

    def _back_off(self, cold: bool) -> None:
        """After a window of mostly cold texts (text that does not repeat its words), give the next 64, 128, ...
        4,096 texts to `tokenizers` without trying; a warm window resets the wait."""
        self._window[0] += 1
        self._window[1] += cold
        if self._window[0] < WINDOW:
            return
        if 2 * self._window[1] > self._window[0]:
            self._backoff = min(2 * self._backoff or 1, 64)
            self._skip = WINDOW * self._backoff
        else:
            self._backoff = 0
        self._window = [0, 0]

    def _encoding(self, pieces, entries, leads, add_special_tokens: bool) -> FastEncoding:
        prefix, suffix = self._specials if add_special_tokens else ((), ())
        return FastEncoding(pieces, entries, self._token_bytes, leads, prefix, suffix)

    def encode(self, text: str, add_special_tokens: bool = True) -> FastEncoding | None:
        """The encoding of `text`, or None: use `tokenizers`."""
        got = self.split(text)
        if got is None:
            return None
        pieces, entries, leads = got
        if None in entries:
            entries = [e if e is not None else self._bpe(p) for p, e in zip(pieces, entries)]
        return self._encoding(pieces, entries, leads, add_special_tokens)

    def encode_batch(self, texts: list[str], add_special_tokens: bool) -> list:
        """Encodings of `texts`: this path's, or `tokenizers`' for the texts it does not take and for texts whose
        pieces are mostly new (the BPE of a new piece costs more from Python than in `tokenizers`; their pieces
        are learned from `tokenizers`' encoding)."""
        out: list = [None] * len(texts)
        cold = skipped = 0
        for i, text in enumerate(texts):
            if self._skip:
                self._skip -= 1
                skipped += 1
                continue
            got = self.split(text)
            if got is None:
                continue
            pieces, entries, leads = got
            is_cold = False
            if None in entries:
                misses = entries.count(None)
                if misses > COLD_MISSES and misses * 4 > len(pieces):
                    out[i] = self._tok.encode(text, add_special_tokens=add_special_tokens)
                    self._learn(pieces, entries, out[i], add_special_tokens)      # at once: the next texts find these pieces
                    is_cold = True
                    cold += 1
                else:
                    entries = [e if e is not None else self._bpe(p) for p, e in zip(pieces, entries)]
            if not is_cold:
                out[i] = self._encoding(pieces, entries, leads, add_special_tokens)
            self._back_off(is_cold)
        rest = [i for i, e in enumerate(out) if e is None]
        self.stats["fast"] += len(texts) - len(rest) - cold
        self.stats["cold"] += cold + skipped
        self.stats["fallback"] += len(rest) - skipped
        if rest:
            for i, enc in zip(rest, self._tok.encode_batch([texts[i] for i in rest], add_special_tokens=add_special_tokens)):
                out[i] = enc
        return out


def encode_texts(fast: FastBPE | None, tokenizer, texts: list[str], add_special_tokens: bool) -> list:
    """Encodings of `texts`: the fast path's where it applies (`FastBPE.encode_batch`), else `tokenizers`'."""
    if fast is None:
        return tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
    return fast.encode_batch(texts, add_special_tokens)
