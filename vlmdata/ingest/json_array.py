"""Streaming the items of a top-level JSON array (LLaVA's layout) with bounded memory; a bad item costs one row.

`iter_json_array(f)` reads a binary file in chunks and yields each item:
a dict, or a `BadRow` (a str: the error) for an item that is not an object or
does not parse. A syntax error, a number over Python's 4300-digit limit or
nesting deeper than the recursion limit costs exactly that item; the parser
finds where it ends and goes on with the next:

1. The bad item's extent is found by a scan that knows strings and matches
   brackets; when it ends at a `,` or `]` the next item starts there.
2. When that fails (an unbalanced quote, a mismatched bracket), the parser looks for the
   next `{` after a `,` that starts a complete object followed by `,` or `]`;
   in a pretty-printed file it must sit at the bad item's indentation, so
   objects nested inside the bad item are not taken for rows. Everything
   between is that one bad row.

No item is held beyond `max_item_chars` (16 Mi characters by default): a
longer one is a bad row, and resynchronisation keeps only a bounded window,
so a broken file never ends up in memory whole. Text after the closing
bracket is one bad row too (a second array after it is read as well); a file
that ends without its closing bracket keeps every complete item (a warning
is logged).
"""
from __future__ import annotations

import codecs
import json
import logging
import re
from collections.abc import Iterator

__all__ = ["MAX_ITEM_CHARS", "BadRow", "iter_json_array"]

log = logging.getLogger(__name__)
MAX_ITEM_CHARS = 16 << 20
_CHUNK = 1 << 20
_STRUCT = re.compile(r'["\[\]{}]')
_IN_STRING = re.compile(r'["\\]')
_SCALAR_END = re.compile(r"[,\]\s]")
_CANDIDATE = re.compile(r",\s*\{")
_WS = " \t\r\n"


class BadRow(str):
    """A row that could not be parsed; its text is the error."""


_BROKEN = -1
_CLOSER = {"[": "]", "{": "}"}


def _item_end(buf: str, pos: int) -> int | None:
    """Index just after the item starting at `pos` (strings and brackets respected).

    None if `buf` ends first; `_BROKEN` when a closing bracket does not match its opener.
    """
    first = buf[pos]
    if first not in '[{"':
        m = _SCALAR_END.search(buf, pos)
        return m.start() if m else None
    stack: list[str] = []
    i, in_string = pos, False
    while True:
        if in_string:
            m = _IN_STRING.search(buf, i)
            if m is None:
                return None
            if m.group() == "\\":
                i = m.end() + 1
                continue
            in_string, i = False, m.end()
            if not stack:
                return i
            continue
        m = _STRUCT.search(buf, i)
        if m is None:
            return None
        c, i = m.group(), m.end()
        if c == '"':
            in_string = True
        elif c in _CLOSER:
            stack.append(_CLOSER[c])
        elif not stack or stack.pop() != c:
            return _BROKEN
        elif not stack:
            return i


class _Stream:
    """A sliding window of decoded text over the file."""

    def __init__(self, f, chunk_size: int):
        self.f = f
        self.chunk_size = chunk_size
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.buf, self.pos, self.eof, self.dropped = "", 0, False, 0

    def fill(self, grow: bool = False) -> bool:
        """Read one more chunk (dropping what was consumed); False at the end of the file.

        `grow`: read as much again as is buffered (at least a chunk), so an item that needs many
        chunks is rescanned O(log n) times, not once per chunk.
        """
        if self.eof:
            return False
        data = self.f.read(max(self.chunk_size, len(self.buf) - self.pos) if grow else self.chunk_size)
        self.eof = not data
        self.dropped += self.pos
        self.buf = self.buf[self.pos:] + self.utf8.decode(data, final=self.eof)
        self.pos = 0
        return not self.eof

    def skip(self, chars: str) -> bool:
        """Advance past `chars`; False when the file ends first."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in chars:
                self.pos += 1
            if self.pos < len(self.buf):
                return True
            if not self.fill():
                return False

    def offset(self, pos: int | None = None) -> int:
        return self.dropped + (self.pos if pos is None else pos)

    def column(self, pos: int) -> int | None:
        """Column of `pos` when only whitespace precedes it on its line (a pretty-printed item), else None."""
        line = self.buf.rfind("\n", 0, pos)
        if line < 0:
            return None
        return pos - line - 1 if not self.buf[line + 1:pos].strip() else None


def iter_json_array(f, chunk_size: int = _CHUNK, max_item_chars: int = MAX_ITEM_CHARS) -> Iterator[dict | BadRow]:
    """Items of a top-level JSON array read incrementally from a binary file (see the module docstring)."""
    s = _Stream(f, chunk_size)
    decoder = json.JSONDecoder()
    s.fill()
    if not s.skip(_WS):
        yield BadRow("empty input: expected a JSON array")
        return
    if s.buf[s.pos] != "[":
        yield BadRow("expected a JSON array at the top level")
        return
    s.pos += 1
    while True:
        if not s.skip(_WS + ","):
            log.warning("JSON array input ends at character %d without its closing bracket (truncated?)",
                        s.offset())
            return
        if s.buf[s.pos] == "]":
            s.pos += 1
            if not s.skip(_WS):
                return
            if s.buf[s.pos] == "[":            # a second array right after the first: read it too
                s.pos += 1
                continue
            yield BadRow(f"text after the end of the array at character {s.offset()}")
            if not _resync(s, decoder, None, max_item_chars):
                return
            continue
        start = s.pos
        try:
            obj, end = decoder.raw_decode(s.buf, start)
        except (ValueError, RecursionError) as exc:    # JSONDecodeError, 4300-digit ints, deep nesting
            end = _item_end(s.buf, start)
            if end is None and not s.eof and len(s.buf) - start < max_item_chars:
                s.fill(grow=True)
                continue
            column = s.column(start)
            yield BadRow(f"unparseable JSON array item at character {s.offset(start)}: "
                         f"{type(exc).__name__}: {str(exc)[:160]}")
            if end is None or end == _BROKEN:    # no usable end: look for the next item after its start
                s.pos = start + 1
            else:
                s.pos = end
                if _followed_by_separator(s):
                    continue
            if not _resync(s, decoder, column, max_item_chars):
                return
            continue
        if end == len(s.buf) and not s.eof:     # a number or literal may continue in the next chunk
            if s.fill():
                continue
        s.pos = end
        yield obj if isinstance(obj, dict) else BadRow(f"array item is a {type(obj).__name__}, not an object")


def _followed_by_separator(s: _Stream) -> bool:
    if not s.skip(_WS):
        return True                           # the end of the input: reported as an unclosed array
    return s.buf[s.pos] in ",]"


def _resync(s: _Stream, decoder: json.JSONDecoder, column: int | None, max_item_chars: int) -> bool:
    """Move `s.pos` to the next item that starts a complete object (see the module docstring); False at EOF."""
    while True:
        m = _CANDIDATE.search(s.buf, s.pos)
        if m is None:
            if s.eof:
                s.pos = len(s.buf)
                return False
            s.pos = max(s.pos, len(s.buf) - 64)   # keep a short tail: a candidate may straddle chunks
            s.fill()
            continue
        q = m.end() - 1
        if column is not None and s.column(q) != column:
            s.pos = q + 1
            continue
        end = _item_end(s.buf, q)
        if end == _BROKEN:
            s.pos = q + 1
            continue
        if end is None and not s.eof and len(s.buf) - q < max_item_chars:
            s.pos = m.start()
            s.fill(grow=True)
            continue
        try:
            obj, end = decoder.raw_decode(s.buf, q)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            rest = s.buf[end:].lstrip(_WS)
            if rest[:1] in (",", "]") or (not rest and s.eof):
                s.pos = q
                return True
            if not rest and not s.eof:
                s.pos = m.start()
                s.fill()
                continue
        s.pos = q + 1
