"""The LLaVA JSON array reader: a bad item costs exactly one row, the rest is read, memory stays bounded."""
from __future__ import annotations

import io
import json

import pytest

from vlmdata.ingest import iter_json_array


def item(i: int) -> dict:
    return {"id": f"r{i}", "image": f"imgs/{i}.jpg",
            "conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": f"answer {i}"}]}


def array_with(bad: str, n: int = 200, at: int = 2, indent: int | None = None) -> bytes:
    parts = [json.dumps(item(i), indent=indent) for i in range(n)]
    parts[at] = bad
    sep = ",\n" if indent else ", "
    return ("[\n" + sep.join(parts) + "\n]\n").encode()


def read(data: bytes, chunk: int = 4096, **kw) -> list:
    return list(iter_json_array(io.BytesIO(data), chunk_size=chunk, **kw))


def check_one_bad(rows: list, n: int = 200, at: int = 2) -> None:
    bad = [i for i, r in enumerate(rows) if not isinstance(r, dict)]
    assert len(rows) == n and bad == [at], (len(rows), bad[:5])
    assert [r["id"] for r in rows if isinstance(r, dict)] == [f"r{i}" for i in range(n) if i != at]


@pytest.mark.parametrize("bad", [
    '{"id": "r2",, "image": "x"}',                               # the audit's syntax error
    '{"id": "r2", "image": "x" "conversations": []}',            # missing comma
    '{"id": "r2", "n": ' + "1" * 5000 + "}",                     # over Python's 4300-digit limit
    '{"id": "r2", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}",   # RecursionError in the parser
    '{"id": "r2", "x": nul}',                                    # bad literal
    '{"id": "r2", "x": "tab\tinside"}',                          # control character in a string
    '{"id": "r2", "x": [1, 2}',                                  # mismatched bracket
    '{"id": "r2", "x": "unterminated}',                          # unbalanced quote
    '"just a string"',                                           # not an object
])
@pytest.mark.parametrize("indent", [None, 2])
def test_a_bad_item_costs_one_row(bad, indent):
    check_one_bad(read(array_with(bad, indent=indent)))


def test_small_chunks_and_a_bad_item_in_the_last_place():
    check_one_bad(read(array_with('{"id": oops}', n=30, at=29), chunk=7), n=30, at=29)
    check_one_bad(read(array_with('{"id": oops}', n=30, at=0), chunk=7), n=30, at=0)


def test_memory_stays_bounded_after_an_error():
    """The old parser kept filling its buffer to the end of the file after an error; now an item is capped."""
    data = array_with('{"id": "r2", "x": "never closed', n=2000)

    rows = list(iter_json_array(io.BytesIO(data), chunk_size=1024, max_item_chars=8192))
    assert len([r for r in rows if isinstance(r, dict)]) == 1999
    huge = b'[{"id": "big", "x": "' + b"y" * 50_000 + b'"}, {"id": "next"}]'
    got = read(huge, chunk=1024, max_item_chars=10_000)
    assert not isinstance(got[0], dict) and got[1] == {"id": "next"} and len(got) == 2


def test_text_after_the_array_and_concatenated_arrays():
    assert read(b'[{"id": 1}] [{"id": 2}]') == [{"id": 1}, {"id": 2}]
    got = read(b'[{"id": 1}] trailing, {"id": 3}]')
    assert got[0] == {"id": 1} and not isinstance(got[1], dict) and got[2] == {"id": 3}
    assert read(b'[{"id": 1}, {"id": 2}') == [{"id": 1}, {"id": 2}]   # no closing bracket: items kept
