"""Streaming the rows of a CSV/TSV file with bounded memory; a malformed record costs one row.

`iter_csv_rows(text)` yields a dict per record (header row = column names;
missing trailing fields are None) or a `BadRow` for a record that cannot be
trusted, and goes on with the next:

- a record the `csv` module rejects (a field over the limit);
- a record longer than `max_record_chars` (16 Mi characters; the csv field
  limit is raised to it, so long captions are read, not dropped);
- a record that spans several physical lines (a quoted field with newlines)
  and ends at the end of the file, has a different number of fields than the
  header or fails the csv module's strict mode (text right after a closing
  quote): the signatures of an unterminated quote that swallowed the lines
  after it (single-line records stay leniently parsed). A stray quote closed
  exactly at the end of a later field, in a later row with as many fields, is
  indistinguishable from a legitimate multi-line field and is read as one;
- more fields than header columns.

After a bad record, reading restarts at the second physical line of that
record: the lines it swallowed are read again as the rows they are. Only the
current record's lines are kept, and lines are read at most
`max_record_chars` at a time, so neither a huge line nor a runaway quote can
fill memory.
"""
from __future__ import annotations

import csv
from collections import deque
from collections.abc import Iterator

from vlmdata.ingest.json_array import BadRow

__all__ = ["MAX_RECORD_CHARS", "iter_csv_rows"]

MAX_RECORD_CHARS = 16 << 20


class _TooLong(Exception):
    """The current record passed `max_record_chars`."""


class _Lines:
    """Physical lines for csv.reader, remembering the current record's lines so they can be read again."""

    def __init__(self, text, max_chars: int):
        self.text = text
        self.max_chars = max_chars
        self.replay: deque[tuple[int, str]] = deque()
        self.record: list[tuple[int, str]] = []
        self.chars = 0
        self.number = 0            # physical lines read from the file
        self.hit_eof = False

    def __iter__(self) -> _Lines:
        return self

    def start_record(self) -> None:
        self.record, self.chars, self.hit_eof = [], 0, False

    def first_line(self) -> int:
        return self.record[0][0] if self.record else self.number + 1

    def again(self) -> None:
        """Read the current record's lines after its first one again (in order, before anything new)."""
        self.replay.extendleft(reversed(self.record[1:]))
        self.start_record()

    def __next__(self) -> str:
        if self.replay:
            item = self.replay.popleft()
        else:
            line = self._read_line()
            if line is None:
                self.hit_eof = True
                raise StopIteration
            self.number += 1
            item = (self.number, line)
        self.record.append(item)
        self.chars += len(item[1])
        if self.chars > self.max_chars:
            raise _TooLong
        return item[1]

    def _read_line(self) -> str | None:
        line = self.text.readline(self.max_chars + 1)
        if not line:
            return None
        if len(line) > self.max_chars and not line.endswith(("\n", "\r")):
            while True:   # the rest of an overlong physical line is dropped without being held
                more = self.text.readline(self.max_chars + 1)
                if not more or more.endswith(("\n", "\r")):
                    break
        return line


def _strict_ok(record: list[tuple[int, str]], delimiter: str) -> bool:
    """Whether a multi-line record also parses in strict mode (a quote closed by accident leaves text after it)."""
    try:
        list(csv.reader([line for _, line in record], delimiter=delimiter, strict=True))
    except csv.Error:
        return False
    return True


def iter_csv_rows(text, delimiter: str = ",", max_record_chars: int = MAX_RECORD_CHARS) -> Iterator[dict | BadRow]:
    """Rows of a CSV text stream opened with newline="" (see the module docstring)."""
    if csv.field_size_limit() < max_record_chars:
        csv.field_size_limit(max_record_chars)
    lines = _Lines(text, max_record_chars)
    header: list[str] | None = None
    reader = csv.reader(lines, delimiter=delimiter)
    while True:
        lines.start_record()
        try:
            rec = next(reader)
        except StopIteration:
            return
        except (csv.Error, _TooLong) as exc:
            why = f"longer than {max_record_chars} characters" if isinstance(exc, _TooLong) else str(exc)
            yield BadRow(f"line {lines.first_line()}: {why}")
            lines.again()
            reader = csv.reader(lines, delimiter=delimiter)
            continue
        if not rec:
            continue                                   # a blank line, as csv.DictReader skips it
        if header is None:
            header = rec
            continue
        multi_line = len(lines.record) > 1
        if multi_line and (lines.hit_eof or len(rec) != len(header) or not _strict_ok(lines.record, delimiter)):
            yield BadRow(f"line {lines.first_line()}: a quoted field runs over {len(lines.record)} lines "
                         f"{'to the end of the file' if lines.hit_eof else 'and leaves the wrong number of fields'}"
                         " (an unterminated quote?)")
            lines.again()
            reader = csv.reader(lines, delimiter=delimiter)
            continue
        if len(rec) > len(header):
            yield BadRow(f"line {lines.first_line()}: {len(rec) - len(header)} extra fields")
            continue
        yield dict(zip(header, rec + [None] * (len(header) - len(rec))))
