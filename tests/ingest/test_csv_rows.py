"""The CSV reader: a field over the csv module's limit is read, an unterminated quote or an overlong record
costs one row (counted), never the rest of the file; memory stays bounded."""
from __future__ import annotations

import io

from vlmdata.ingest import iter_csv_rows


def lines(n: int = 50, caption=lambda i: f"caption {i}") -> list[str]:
    return ["id,image,caption\n"] + [f"r{i},imgs/{i}.jpg,{caption(i)}\n" for i in range(n)]


def read(text: str, **kw) -> list:
    return list(iter_csv_rows(io.StringIO(text, newline=""), **kw))


def ids(rows) -> list[str]:
    return [r["id"] for r in rows if isinstance(r, dict)]


def test_a_field_over_the_csv_limit_is_read():
    big = "x" * (131072 + 10)                 # over the csv module's default field_size_limit()
    rows = read("".join(lines(caption=lambda i: big if i == 1 else f"c{i}")))
    assert len(rows) == 50 and ids(rows) == [f"r{i}" for i in range(50)] and rows[1]["caption"] == big


def test_an_overlong_record_costs_one_row():
    rows = read("".join(lines(caption=lambda i: "y" * 5000 if i == 1 else f"c{i}")), max_record_chars=1000)
    assert len(rows) == 50 and ids(rows) == [f"r{i}" for i in range(50) if i != 1]
    assert "longer than 1000" in rows[1]


def test_an_unterminated_quote_costs_one_row():
    body = lines()
    body[3] = 'r2,imgs/2.jpg,"a caption whose quote never closes\n'
    rows = read("".join(body))
    assert len(rows) == 50 and ids(rows) == [f"r{i}" for i in range(50) if i != 2]
    assert "unterminated quote" in rows[2]


def test_a_quote_closed_rows_later_costs_one_row():
    body = lines()
    body[3] = 'r2,imgs/2.jpg,"opens here\n'
    body[10] = 'r9,imgs/9.jpg,"and closes" here\n'
    rows = read("".join(body))
    assert len(rows) == 50 and ids(rows) == [f"r{i}" for i in range(50) if i != 2]


def test_legit_multiline_fields_stay_one_row():
    body = lines(5)
    body[2] = 'r1,imgs/1.jpg,"two\nlines, with a comma"\n'
    rows = read("".join(body))
    assert rows[1]["caption"] == "two\nlines, with a comma" and ids(rows) == ["r0", "r1", "r2", "r3", "r4"]


def test_extra_and_missing_fields():
    rows = read("id,image,caption\na,b,c,d\ne,f\n")
    assert "extra fields" in rows[0] and rows[1] == {"id": "e", "image": "f", "caption": None}
